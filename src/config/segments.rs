//! The `segments:` section: named files of integer IDs (portable roaring bitmaps) and the
//! key part whose value is looked up in each.
//!
//! Reading the config only records where each file is (relative paths against the config
//! file's directory); the runtime loads the files when it is built, as it resolves
//! upstream names, so a missing or corrupt file refuses a start or a reload with the file
//! named, and the old config keeps serving.

use std::path::Path;

use crate::config::model::SegmentSpec;
use crate::config::names::{is_label, key_part, label_message};
use crate::config::report::{child, Report};
use crate::config::scalar;
use crate::config::suggest;
use crate::config::yaml::Node;

/// Segments a config may name.
pub(crate) const MAX_SEGMENTS: usize = 256;

/// The keys one segment takes.
pub(crate) const SEGMENT_KEYS: [&str; 2] = ["file", "of"];

/// Reads `segments:`; `file` is the config file, whose directory relative paths start in.
pub(crate) fn parse(r: &mut Report, node: Option<&Node>, file: &str) -> Vec<SegmentSpec> {
    let Some(entries) = node.and_then(|n| scalar::map(r, n, "segments")) else {
        return Vec::new();
    };
    if entries.len() > MAX_SEGMENTS {
        let message = crate::config::bounds::too_many("segments", entries.len(), MAX_SEGMENTS);
        r.error(
            node.map_or_else(Default::default, |n| n.pos),
            "segments",
            message,
        );
        return Vec::new();
    }
    let base = Path::new(file)
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let mut out = Vec::with_capacity(entries.len());
    for e in entries {
        let path = child("segments", &e.key);
        if !is_label(&e.key) {
            r.error(e.key_pos, &path, label_message("segment", &e.key));
        }
        let Some(fields) = scalar::map(r, &e.value, &path) else {
            continue;
        };
        let (mut at, mut of) = (None, None);
        for f in fields {
            let sub = child(&path, &f.key);
            match f.key.as_str() {
                "file" => at = scalar::text(r, &f.value, &sub).map(|t| base.join(t)),
                "of" => {
                    of = scalar::text(r, &f.value, &sub)
                        .and_then(|t| key_part(r, t, f.value.pos, &sub));
                    if of.as_ref().is_some_and(|p| p.needs_server()) {
                        r.error(f.value.pos, &sub, "a segment's IDs come from a request part, not from the upstream server");
                        of = None;
                    }
                }
                other => r.error(
                    f.key_pos,
                    &sub,
                    suggest::unknown("key", other, &SEGMENT_KEYS),
                ),
            }
        }
        for (name, present) in [("file", at.is_some()), ("of", of.is_some())] {
            if !present && fields.iter().all(|f| f.key != name) {
                r.error(e.key_pos, &path, format!("missing required field `{name}`"));
            }
        }
        if let (Some(file), Some(of)) = (at, of) {
            out.push(SegmentSpec {
                name: e.key.clone(),
                file,
                of,
            });
        }
    }
    out
}
