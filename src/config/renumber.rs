//! A reload's ids (see `ids`): the reloaded file is loaded and numbered by position like
//! any file, then [`carry_ids`] gives every provider, connection and combo the reloaded
//! file keeps (same name) the id it had, and every new one an id never given before in
//! this process, and renumbers every reference to them.

use std::collections::HashMap;

use super::ids::{NONE, Slots};
use super::{ComboId, Config, ConnectionId, ProviderId};

/// Ids for `new` (freshly loaded, numbered by position) that continue `old`'s: an entry
/// with a name `old` has takes its id there, a new one the next id never given. `Err`
/// names a list whose ids ran out (a restart numbers afresh).
pub fn carry_ids(new: &mut Config, old: &Config) -> Result<(), String> {
    // Providers.
    let by_name: HashMap<&str, ProviderId> = old
        .providers
        .iter()
        .map(|p| (p.name.as_str(), p.id))
        .collect();
    let mut next = old.ids.provider_bound();
    let mut provider_map = Vec::with_capacity(new.providers.len());
    for p in &new.providers {
        let id = match by_name.get(p.name.as_str()) {
            Some(id) => *id,
            None => {
                let id = u16::try_from(next)
                    .ok()
                    .filter(|n| *n < u16::MAX)
                    .ok_or("providers: no provider id left for a new provider; restart to apply")?;
                next += 1;
                ProviderId(id)
            }
        };
        provider_map.push(id);
    }
    let provider = |id: ProviderId| {
        provider_map
            .get(usize::from(id.0))
            .copied()
            .unwrap_or(ProviderId(u16::MAX))
    };
    // Connections.
    let by_name: HashMap<&str, ConnectionId> = old
        .connections
        .iter()
        .map(|c| (c.name.as_str(), c.id))
        .collect();
    let mut next = old.ids.connection_bound();
    let mut connection_map = Vec::with_capacity(new.connections.len());
    for c in &new.connections {
        let id = match by_name.get(c.name.as_str()) {
            Some(id) => *id,
            None => {
                let id = u32::try_from(next).ok().filter(|n| *n < NONE).ok_or(
                    "connections: no connection id left for a new connection; restart to apply",
                )?;
                next += 1;
                ConnectionId(id)
            }
        };
        connection_map.push(id);
    }
    let connection = |id: ConnectionId| {
        connection_map
            .get(id.0 as usize)
            .copied()
            .unwrap_or(ConnectionId(NONE))
    };
    // Combos.
    let by_name: HashMap<&str, ComboId> =
        old.combos.iter().map(|c| (c.name.as_str(), c.id)).collect();
    let mut next = old.ids.combo_bound();
    let mut combo_ids = Vec::with_capacity(new.combos.len());
    for c in &new.combos {
        let id = match by_name.get(c.name.as_str()) {
            Some(id) => *id,
            None => {
                let id = u16::try_from(next)
                    .ok()
                    .filter(|n| *n < u16::MAX)
                    .ok_or("combos: no combo id left for a new combo; restart to apply")?;
                next += 1;
                ComboId(id)
            }
        };
        combo_ids.push(id);
    }
    // Every reference, renumbered.
    for p in &mut new.providers {
        p.id = provider(p.id);
    }
    for c in &mut new.connections {
        c.id = connection(c.id);
        c.provider = provider(c.provider);
    }
    for (c, id) in new.combos.iter_mut().zip(combo_ids) {
        c.id = id;
        for t in &mut c.targets {
            t.provider = provider(t.provider);
        }
    }
    for k in &mut new.client_keys {
        if let Some(list) = &mut k.allowed_connections {
            for c in list.iter_mut() {
                *c = connection(*c);
            }
        }
    }
    if let Some(fb) = &mut new.emergency_fallback {
        fb.provider = provider(fb.provider);
    }
    new.ids = Slots::new(
        new.providers.iter().map(|p| p.id),
        new.connections.iter().map(|c| c.id),
        new.combos.iter().map(|c| c.id),
        &old.ids,
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(toml: &str) -> Config {
        super::super::validate::load_str(toml, &|_| None)
            .expect("valid")
            .config
    }

    fn file(providers: &[&str], connections: &[(&str, &str)], combos: &[&str]) -> String {
        let mut s = String::new();
        for p in providers {
            s += &format!("[[providers]]\nid = \"{p}\"\nformat = \"mock\"\nmodels = [\"m\"]\n\n");
        }
        for (c, p) in connections {
            s += &format!("[[connections]]\nid = \"{c}\"\nprovider = \"{p}\"\n\n");
        }
        for c in combos {
            s += &format!(
                "[[combos]]\nname = \"{c}\"\nstrategy = \"priority\"\ntargets = [\"{}/m\"]\n\n",
                providers[0]
            );
        }
        s
    }

    #[test]
    fn kept_entries_keep_their_ids_new_ones_get_unused_ones() {
        let old = load(&file(
            &["a", "b"],
            &[("a1", "a"), ("b1", "b"), ("b2", "b")],
            &["x", "y"],
        ));
        // Reordered, `b1` and `x` removed, `c`/`c1`/`z` added.
        let mut new = load(&file(
            &["c", "b", "a"],
            &[("c1", "c"), ("b2", "b"), ("a1", "a")],
            &["z", "y"],
        ));
        carry_ids(&mut new, &old).unwrap();
        let p = |c: &Config, n: &str| c.provider_by_name(n).unwrap().id;
        let conn = |c: &Config, n: &str| c.connections.iter().find(|x| x.name == n).unwrap().id;
        assert_eq!(p(&new, "a"), p(&old, "a"));
        assert_eq!(p(&new, "b"), p(&old, "b"));
        assert_eq!(p(&new, "c"), ProviderId(2));
        assert_eq!(conn(&new, "a1"), conn(&old, "a1"));
        assert_eq!(conn(&new, "b2"), conn(&old, "b2"));
        assert_eq!(conn(&new, "c1"), ConnectionId(3), "b1's id 1 is not reused");
        // References follow, lookups find each by id, the list keeps the file's order.
        let c1 = new.connection(conn(&new, "c1"));
        assert_eq!(new.provider(c1.provider).name, "c");
        assert_eq!(new.provider(p(&new, "a")).name, "a");
        assert_eq!(new.providers[0].name, "c");
        assert_eq!(new.connection_slot(conn(&new, "a1")), Some(2));
        assert!(new.connection_by_id(ConnectionId(1)).is_none());
        assert_eq!(new.connection(ConnectionId(1)).name, "(removed)");
        let combo = |c: &Config, n: &str| c.combos.iter().find(|x| x.name == n).unwrap().id;
        assert_eq!(combo(&new, "y"), combo(&old, "y"));
        assert_eq!(combo(&new, "z"), ComboId(2));
        assert_eq!(new.combo_by_id(combo(&new, "y")).unwrap().name, "y");
        assert_eq!(new.provider(new.combos[0].targets[0].provider).name, "c");
        // A client key's allowed connections follow their names.
        let keyed = |c: &str| {
            format!("{c}[[client_keys]]\nid = \"t\"\nkey = \"k\"\nallowed_connections = [\"a1\"]\n")
        };
        let old_keyed = load(&keyed(&file(&["a", "b"], &[("b1", "b"), ("a1", "a")], &[])));
        let mut new_keyed = load(&keyed(&file(&["b", "a"], &[("a1", "a"), ("b1", "b")], &[])));
        carry_ids(&mut new_keyed, &old_keyed).unwrap();
        let allowed = new_keyed.client_keys[0]
            .allowed_connections
            .clone()
            .unwrap();
        assert_eq!(allowed, vec![conn(&old_keyed, "a1")]);
        assert_eq!(new_keyed.connection(allowed[0]).name, "a1");
        // A second reload continues from the first.
        let mut again = load(&file(&["d"], &[("d1", "d")], &[]));
        carry_ids(&mut again, &new).unwrap();
        assert_eq!(p(&again, "d"), ProviderId(3));
        assert_eq!(conn(&again, "d1"), ConnectionId(4));
        assert_eq!(again.ids.provider_bound(), 4);
    }
}
