//! Defaults meet origins: every origin gets each default limit, with its own fields laid
//! over a default of the same name, then its own limits.
//!
//! Order in [`Origin::limits`](crate::config::model::Origin::limits): the defaults in file
//! order (minus those turned `off`), then the origin's own limits in file order. A default
//! is resolved once on its own, so its errors are reported at its own lines.

use crate::config::model::Limit;
use crate::config::report::Report;
use crate::config::resolve::{resolve, Resolved};
use crate::config::spec::LimitSpec;

/// The default limits, as written and as resolved on their own.
#[derive(Debug, Default)]
pub(crate) struct Defaults {
    specs: Vec<LimitSpec>,
    resolved: Vec<Option<Resolved>>,
}

/// Resolves each default limit on its own, reporting its errors once.
pub(crate) fn resolve_defaults(r: &mut Report, specs: Vec<LimitSpec>) -> Defaults {
    let resolved = specs.iter().map(|s| resolve(r, s, false)).collect();
    Defaults { specs, resolved }
}

/// The limits of one origin whose own `limits:` are `own`.
pub(crate) fn origin_limits(r: &mut Report, defaults: &Defaults, own: &[LimitSpec]) -> Vec<Limit> {
    let mut out = Vec::new();
    for (default, resolved) in defaults.specs.iter().zip(&defaults.resolved) {
        let result = match own.iter().find(|o| o.name == default.name) {
            Some(mine) => {
                check_kind(r, default, mine);
                resolve(r, &default.merged(mine), true)
            }
            None => resolved.clone(),
        };
        if let Some(Resolved::On(limit)) = result {
            out.push(limit);
        }
    }
    for mine in own {
        if defaults.specs.iter().all(|d| d.name != mine.name) {
            if let Some(Resolved::On(limit)) = resolve(r, mine, false) {
                out.push(limit);
            }
        }
    }
    out
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
