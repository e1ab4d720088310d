//! Defaults meet origins: every origin gets each default limit, with its own fields laid
//! over a default of the same name, then its own limits.
//!
//! Order in [`Origin::limits`](crate::config::model::Origin::limits): the defaults in file
//! order (minus those turned `off`), then the origin's own limits in file order. A default
//! is resolved once on its own, so its errors are reported at its own lines.

use std::collections::{HashMap, HashSet};

use crate::config::model::Limit;
use crate::config::report::{At, Pos, Report};
use crate::config::resolve::{resolve, Known, Resolved};
use crate::config::spec::LimitSpec;

/// The default limits, as written and as resolved on their own.
#[derive(Debug, Default)]
pub(crate) struct Defaults {
    specs: Vec<LimitSpec>,
    resolved: Vec<Option<Resolved>>,
}

/// Resolves each default limit on its own, reporting its errors once.
pub(crate) fn resolve_defaults(
    r: &mut Report,
    specs: Vec<LimitSpec>,
    known: &Known<'_>,
) -> Defaults {
    let resolved = specs.iter().map(|s| resolve(r, s, false, known)).collect();
    Defaults { specs, resolved }
}

/// The limits of one origin whose own `limits:` are `own`, each located where the size of
/// its state is written (see [`size_anchor`]), for the memory budget.
///
/// Names are looked up in hash maps, so an origin with `o` limits over `d` defaults costs
/// O(o + d), not O(o · d).
pub(crate) fn origin_limits(
    r: &mut Report,
    defaults: &Defaults,
    own: &[LimitSpec],
    known: &Known<'_>,
) -> Vec<At<Limit>> {
    // Names are unique within a mapping (the YAML reader refuses repeats).
    let by_name: HashMap<&str, &LimitSpec> = own.iter().map(|o| (o.name.as_str(), o)).collect();
    let default_names: HashSet<&str> = defaults.specs.iter().map(|d| d.name.as_str()).collect();
    let mut out = Vec::new();
    let mut keep = |result: Option<Resolved>, spec: &LimitSpec| {
        if let Some(Resolved::On(limit)) = result {
            let (pos, path) = size_anchor(spec);
            out.push(At::new(limit, pos, path));
        }
    };
    for (default, resolved) in defaults.specs.iter().zip(&defaults.resolved) {
        match by_name.get(default.name.as_str()) {
            Some(mine) => {
                check_kind(r, default, mine);
                let merged = default.merged(mine);
                keep(resolve(r, &merged, true, known), &merged);
            }
            None => keep(resolved.clone(), default),
        }
    }
    for mine in own {
        if !default_names.contains(mine.name.as_str()) {
            keep(resolve(r, mine, false, known), mine);
        }
    }
    out
}

/// Where the size of a limit's state is written: `max_keys`, `sketch.slots` or
/// `sketch.hashes`, or the limit itself when its size is the default.
pub(crate) fn size_anchor(spec: &LimitSpec) -> (Pos, &str) {
    [&spec.max_keys, &spec.slots, &spec.hashes]
        .into_iter()
        .find_map(|f| f.as_ref().map(|a| (a.pos, a.path.as_str())))
        .unwrap_or((spec.pos, spec.path.as_str()))
}

/// An origin may not change the kind of a default it overrides.
fn check_kind(r: &mut Report, default: &LimitSpec, mine: &LimitSpec) {
    if let (Some(was), Some(now)) = (&default.kind, &mine.kind) {
        if was.v != now.v {
            r.error(
                now.pos,
                &now.path,
                format!(
                    "limit `{}` overrides a default of kind `{}` and cannot change it to `{}`",
                    mine.name,
                    was.v.name(),
                    now.v.name()
                ),
            );
        }
    }
}
