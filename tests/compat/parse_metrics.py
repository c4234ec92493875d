"""Parses a Prometheus text exposition from stdin with prometheus_client's own parser
(tests/compat/requirements.txt) and prints one JSON object: family name -> {type,
samples: [[sample name, labels, value], ...]}. A parse error exits non-zero."""

import json
import sys

from prometheus_client.parser import text_string_to_metric_families


def main() -> int:
    text = sys.stdin.read()
    out = {}
    for family in text_string_to_metric_families(text):
        if family.name in out:
            print(f"family {family.name} appears twice", file=sys.stderr)
            return 1
        out[family.name] = {
            "type": family.type,
            "samples": [[s.name, s.labels, s.value] for s in family.samples],
        }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
