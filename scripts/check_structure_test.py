"""Self-tests of scripts/check-structure over small fixture trees written to a temporary
directory. Run: python3 -m unittest discover -s scripts -p 'check_*_test.py'"""

import importlib.machinery
import importlib.util
import os
import sys
import tempfile
import unittest

_HERE = os.path.dirname(os.path.abspath(__file__))
_loader = importlib.machinery.SourceFileLoader("check_structure", os.path.join(_HERE, "check-structure"))
_spec = importlib.util.spec_from_loader("check_structure", _loader)
cs = importlib.util.module_from_spec(_spec)
sys.modules["check_structure"] = cs  # dataclasses look their module up
_loader.exec_module(cs)

RULES = """
layer top:    app
layer middle: net
layer bottom: clock
only net: clock
"""


class Tree:
    """A src/ tree in a temporary directory, from {relative path: text}."""

    def __init__(self, files: dict[str, str]):
        self._dir = tempfile.TemporaryDirectory()
        self.src = self._dir.name
        for rel, text in files.items():
            path = os.path.join(self.src, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._dir.cleanup()

    def check(self, rules: str = RULES) -> list[str]:
        return cs.check(self.src, cs.Rules.parse(rules))

    def edges(self) -> set[tuple[str, str]]:
        return {(a, c) for a, _, c, _ in cs.Crate.load(self.src).edges()}


CLEAN = {
    "lib.rs": "pub mod app;\npub mod clock;\npub mod net;\n",
    "clock.rs": "pub struct Now(pub u64);\n",
    "net/mod.rs": "pub mod io;\npub use io::Socket;\n",
    "net/io.rs": "use crate::clock::Now;\npub struct Socket(Now);\n",
    "app/mod.rs": "mod serve;\nuse crate::net::Socket;\npub fn run(_: Socket) { serve::go() }\n",
    "app/serve.rs": "pub fn go() { let _ = crate::clock::Now(0); }\n",
}


class CheckStructureTest(unittest.TestCase):
    def test_a_clean_tree_passes(self):
        with Tree(CLEAN) as t:
            self.assertEqual(t.check(), [])

    def test_paths_resolve_to_the_file_that_defines_the_item(self):
        with Tree(CLEAN) as t:
            edges = t.edges()
        # `crate::net::Socket` is re-exported by net/mod.rs from net/io.rs: the import is of io.rs
        self.assertIn(("app/mod.rs", "net/io.rs"), edges)
        self.assertNotIn(("app/mod.rs", "net/mod.rs"), edges)
        # a child module named by its bare name, and an inline `crate::` path
        self.assertIn(("app/mod.rs", "app/serve.rs"), edges)
        self.assertIn(("app/serve.rs", "clock.rs"), edges)
        # a re-export alone is not an import; `mod` declarations are not imports
        self.assertNotIn(("net/mod.rs", "net/io.rs"), edges)
        self.assertNotIn(("lib.rs", "app/mod.rs"), edges)

    def test_detects_a_file_cycle(self):
        tree = dict(CLEAN)
        tree["app/mod.rs"] = "mod serve;\npub struct Plan;\npub fn run() { serve::go() }\n"
        tree["app/serve.rs"] = "use super::Plan;\npub fn go() {}\n"
        with Tree(tree) as t:
            problems = t.check()
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("file import cycle", problems[0])
        self.assertIn("src/app/mod.rs", problems[0])
        self.assertIn("src/app/serve.rs", problems[0])

    def test_an_accepted_cycle_passes_only_while_it_stays_inside_its_globs(self):
        tree = dict(CLEAN)
        tree["app/mod.rs"] = "mod serve;\npub struct Plan;\npub fn run() { serve::go() }\n"
        tree["app/serve.rs"] = "use super::Plan;\npub fn go() {}\n"
        with Tree(tree) as t:
            self.assertEqual(t.check(RULES + "cycle registry: app/*.rs\n"), [])
            self.assertEqual(len(t.check(RULES + "cycle registry: app/mod.rs\n")), 1)

    def test_detects_a_cycle_between_top_level_modules(self):
        tree = dict(CLEAN)
        # clock → app through a `use` tree with a group and a `self` import
        tree["clock.rs"] = "use crate::{app::{self}, net};\npub struct Now(pub u64);\nfn f() { app::run; }\n"
        with Tree(tree) as t:
            problems = t.check("")
        self.assertTrue(any(p.startswith("top-level module import cycle: app -> clock") for p in problems), problems)

    def test_detects_a_layer_violation(self):
        tree = dict(CLEAN)
        tree["net/io.rs"] = "use crate::clock::Now;\npub struct Socket(Now);\nfn f() { crate::app::run; }\n"
        with Tree(tree) as t:
            problems = t.check()
        self.assertIn("src/net/io.rs: imports app (layer middle imports the higher layer top)", problems)
        self.assertIn("src/net/io.rs: imports app (rule 5: net imports only clock)", problems)

    def test_detects_a_deny_rule_through_super_and_a_glob(self):
        tree = dict(CLEAN)
        tree["lib.rs"] += "pub mod domain;\n"
        tree["domain.rs"] = "pub struct Verdict;\n"
        tree["net/io.rs"] = "use super::super::domain::*;\npub struct Socket;\n"
        with Tree(tree) as t:
            problems = t.check(RULES.replace("layer bottom: clock", "layer bottom: clock domain") + "deny net: domain\n")
        self.assertIn("src/net/io.rs: imports domain (rule 6: net may not import domain)", problems)

    def test_an_allow_rule_exempts_only_what_it_names(self):
        tree = dict(CLEAN)
        tree["lib.rs"] += "pub mod domain;\n"
        tree["domain.rs"] = "pub mod labels;\npub mod verdict;\n"
        tree["domain/labels.rs"] = "pub enum Kind { A }\n"
        tree["domain/verdict.rs"] = "pub struct Verdict;\n"
        tree["net/io.rs"] = "use crate::domain::labels::Kind;\nuse crate::domain::verdict::Verdict;\npub struct Socket;\n"
        rules = RULES.replace("layer bottom: clock", "layer bottom: clock domain").replace("only net: clock", "deny net: domain")
        with Tree(tree) as t:
            problems = t.check(rules + "allow net::io: domain::labels\n")
        self.assertEqual(problems, ["src/net/io.rs: imports domain::verdict (rule 5: net may not import domain)"])

    def test_comments_strings_and_test_code_inside_literals_are_not_imports(self):
        tree = dict(CLEAN)
        tree["net/io.rs"] = (
            "// use crate::app::run;\n/* crate::app /* nested */ ::run */\n"
            'const S: &str = "crate::app::run";\nconst R: &str = r#"use crate::app;"#;\n'
            "fn f<'a>(x: &'a u8) -> char { let _ = x; '\"' }\n"
            "pub struct Socket;\n"
        )
        with Tree(tree) as t:
            self.assertEqual(t.check(), [])

    def test_inline_module_super_and_use_bindings(self):
        tree = dict(CLEAN)
        tree["app/serve.rs"] = (
            "use crate::net;\npub fn go() { let _ = net::io::Socket; }\n"
            "mod inner { use super::super::super::clock::Now; fn f(_: Now) {} }\n"
        )
        with Tree(tree) as t:
            edges = t.edges()
        self.assertIn(("app/serve.rs", "net/io.rs"), edges)  # through the binding `net`
        self.assertIn(("app/serve.rs", "clock.rs"), edges)  # super of an inline module

    def test_a_missing_module_file_is_reported(self):
        tree = dict(CLEAN)
        tree["lib.rs"] += "mod gone;\n"
        with Tree(tree) as t, self.assertRaises(cs.TreeError):
            t.check()

    def test_the_rules_name_every_top_level_module(self):
        with Tree(CLEAN) as t:
            problems = t.check("layer top: app\nlayer bottom: clock\n")
        self.assertEqual(problems, ["rules: top-level module `net` is in no layer"])


if __name__ == "__main__":
    unittest.main()
