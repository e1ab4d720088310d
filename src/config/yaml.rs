//! A small YAML tree that remembers where every key and value was written.
//!
//! yaml-rust2's event parser does the scanning; [`parse`] folds its events into [`Node`]s
//! without recursion, so no input can exhaust the stack. Along the way it rejects what a
//! config must not contain (duplicate keys, aliases, custom tags, several documents) and
//! turns a syntax error into a located message. Typing of scalars is left to
//! [`super::scalar`], because YAML's `10` is an integer for `max` but text for `customer`.

use std::collections::HashMap;

use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser, Tag};
use yaml_rust2::scanner::{Marker, TScalarStyle};

use crate::config::report::{child, item, Pos};

/// Nesting deeper than this is refused; real configs use about eight levels.
const MAX_DEPTH: usize = 64;

/// One node of the tree and where it starts.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Node {
    /// The content.
    pub value: Value,
    /// Where the node starts.
    pub pos: Pos,
}

/// A node's content.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    /// A scalar, untyped.
    Scalar(Scalar),
    /// A list.
    Seq(Vec<Node>),
    /// A mapping, in file order, keys unique.
    Map(Vec<Entry>),
    /// A node already reported as an error (an alias, an unsupported tag): checks skip it
    /// silently so that one mistake gives one message.
    Bad,
}

/// A scalar's text, and whether it was written plain (unquoted), which decides whether
/// `10` or `true` are numbers and booleans or text.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Scalar {
    /// The text, after YAML unescaping.
    pub text: String,
    /// Written without quotes or block indicators.
    pub plain: bool,
}

/// One `key: value` pair of a mapping.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Entry {
    /// The key's text.
    pub key: String,
    /// Where the key is written.
    pub key_pos: Pos,
    /// The value.
    pub value: Node,
}

/// A parsed document: the root (absent for an empty file or after a syntax error) and the
/// problems found while building the tree, as `(position, path, message)`.
#[derive(Debug, Default)]
pub(crate) struct Document {
    /// The root node.
    pub root: Option<Node>,
    /// Tree-level problems.
    pub errors: Vec<(Pos, String, String)>,
}

/// Parses `text` into a tree. Never panics; every problem lands in `errors`.
pub(crate) fn parse(text: &str) -> Document {
    let mut parser = Parser::new_from_str(text);
    let mut builder = Builder::default();
    loop {
        match parser.next_token() {
            Ok((event, mark)) => {
                let end = event == Event::StreamEnd;
                builder.on_event(event, mark);
                if end || builder.fatal {
                    break;
                }
            }
            Err(err) => {
                builder.fatal = true;
                builder.errors.push((
                    pos_of(*err.marker()),
                    "(syntax)".to_string(),
                    format!("YAML syntax error: {}", err.info()),
                ));
                break;
            }
        }
    }
    Document {
        root: if builder.fatal { None } else { builder.root },
        errors: builder.errors,
    }
}

fn pos_of(mark: Marker) -> Pos {
    Pos {
        line: mark.line().max(1),
        col: mark.col() + 1,
    }
}

/// What a mapping does with the next node: take it as a key, store it under a key, or drop
/// it (its key was a duplicate or not text).
#[derive(Debug)]
enum Slot {
    Key,
    Value(String, Pos),
    Skip,
}

#[derive(Debug)]
enum Frame {
    Seq {
        pos: Pos,
        items: Vec<Node>,
        bad: bool,
    },
    Map {
        pos: Pos,
        entries: Vec<Entry>,
        keys: KeyIndex,
        slot: Slot,
        bad: bool,
    },
}

/// The keys of one mapping so far, with where each was first written: the duplicate check
/// costs one hash lookup per key, so a mapping of `n` keys is read in O(n), not O(n²).
#[derive(Debug, Default)]
struct KeyIndex {
    first: HashMap<String, Pos>,
}

impl KeyIndex {
    /// Records `key` written at `pos`. A repeat is not recorded again: where the key was
    /// first written is returned instead.
    fn insert(&mut self, key: &str, pos: Pos) -> Option<Pos> {
        if let Some(&first) = self.first.get(key) {
            return Some(first);
        }
        self.first.insert(key.to_string(), pos);
        None
    }
}

#[derive(Debug, Default)]
struct Builder {
    stack: Vec<Frame>,
    root: Option<Node>,
    errors: Vec<(Pos, String, String)>,
    documents: usize,
    fatal: bool,
}

impl Builder {
    /// The path of the place the next node goes to.
    fn slot_path(&self) -> String {
        let mut path = String::new();
        for frame in &self.stack {
            match frame {
                Frame::Seq { items, .. } => path = item(&path, items.len()),
                Frame::Map { slot, .. } => {
                    if let Slot::Value(key, _) = slot {
                        path = child(&path, key);
                    }
                }
            }
        }
        path
    }

    fn error(&mut self, pos: Pos, path: String, message: impl Into<String>) {
        self.errors.push((pos, path, message.into()));
    }

    /// Checks a tag; core-schema tags are accepted (`!!str` makes a scalar text).
    fn tag_ok(&mut self, tag: &Option<Tag>, pos: Pos) -> Result<bool, ()> {
        let Some(tag) = tag else {
            return Ok(false);
        };
        let core = tag.handle == "tag:yaml.org,2002:";
        match tag.suffix.as_str() {
            "str" if core => Ok(true),
            "int" | "bool" | "float" | "null" | "map" | "seq" if core => Ok(false),
            _ => {
                let path = self.slot_path();
                let shown = if core { "!!" } else { tag.handle.as_str() };
                self.error(
                    pos,
                    path,
                    format!("YAML tag `{shown}{}` is not supported", tag.suffix),
                );
                Err(())
            }
        }
    }

    fn open(&mut self, frame: Frame, pos: Pos) {
        if self.stack.len() >= MAX_DEPTH {
            let path = self.slot_path();
            self.error(
                pos,
                path,
                format!("nesting is deeper than {MAX_DEPTH} levels"),
            );
            self.fatal = true;
            return;
        }
        self.stack.push(frame);
    }

    fn close(&mut self) {
        let node = match self.stack.pop() {
            Some(Frame::Seq { pos, items, bad }) => Node {
                value: if bad { Value::Bad } else { Value::Seq(items) },
                pos,
            },
            Some(Frame::Map {
                pos, entries, bad, ..
            }) => Node {
                value: if bad { Value::Bad } else { Value::Map(entries) },
                pos,
            },
            None => return,
        };
        self.push(node);
    }

    /// Puts a finished node where it belongs: the root, a list, or a mapping key or value.
    fn push(&mut self, node: Node) {
        let path = self.slot_path();
        let Some(top) = self.stack.last_mut() else {
            if self.root.is_none() {
                self.root = Some(node);
            }
            return;
        };
        match top {
            Frame::Seq { items, .. } => items.push(node),
            Frame::Map {
                entries,
                keys,
                slot,
                pos: map_pos,
                ..
            } => match std::mem::replace(slot, Slot::Key) {
                Slot::Key => {
                    if entries.is_empty() && node.pos < *map_pos {
                        // A block mapping's start mark lies after its first key.
                        *map_pos = node.pos;
                    }
                    let (next, problem) = key_slot(keys, node, &path);
                    *slot = next;
                    if let Some((pos, path, message)) = problem {
                        self.error(pos, path, message);
                    }
                }
                Slot::Value(key, key_pos) => entries.push(Entry {
                    key,
                    key_pos,
                    value: node,
                }),
                Slot::Skip => {}
            },
        }
    }
}

type Problem = (Pos, String, String);

/// Decides what a key node means for the value that follows it.
fn key_slot(keys: &mut KeyIndex, key: Node, path: &str) -> (Slot, Option<Problem>) {
    match key.value {
        Value::Scalar(scalar) => {
            if let Some(first) = keys.insert(&scalar.text, key.pos) {
                let message = format!(
                    "duplicate key `{}` (first defined at line {})",
                    scalar.text, first.line
                );
                (
                    Slot::Skip,
                    Some((key.pos, child(path, &scalar.text), message)),
                )
            } else {
                (Slot::Value(scalar.text, key.pos), None)
            }
        }
        Value::Bad => (Slot::Skip, None),
        Value::Seq(_) | Value::Map(_) => (
            Slot::Skip,
            Some((
                key.pos,
                path.to_string(),
                "mapping keys must be plain text, not lists or mappings".to_string(),
            )),
        ),
    }
}

impl MarkedEventReceiver for Builder {
    fn on_event(&mut self, event: Event, mark: Marker) {
        if self.fatal {
            return;
        }
        let pos = pos_of(mark);
        match event {
            Event::DocumentStart => {
                self.documents += 1;
                if self.documents > 1 {
                    self.error(pos, "(syntax)".into(), "only one YAML document is allowed");
                    self.fatal = true;
                }
            }
            Event::Scalar(text, style, _anchor, tag) => {
                let value = match self.tag_ok(&tag, pos) {
                    Ok(forced_text) => Value::Scalar(Scalar {
                        text,
                        plain: style == TScalarStyle::Plain && !forced_text,
                    }),
                    Err(()) => Value::Bad,
                };
                self.push(Node { value, pos });
            }
            Event::Alias(_) => {
                let path = self.slot_path();
                self.error(
                    pos,
                    path,
                    "YAML aliases (`*name`) are not supported; write the value out",
                );
                self.push(Node {
                    value: Value::Bad,
                    pos,
                });
            }
            Event::SequenceStart(_, tag) => {
                let bad = self.tag_ok(&tag, pos).is_err();
                let frame = Frame::Seq {
                    pos,
                    items: Vec::new(),
                    bad,
                };
                self.open(frame, pos);
            }
            Event::MappingStart(_, tag) => {
                let bad = self.tag_ok(&tag, pos).is_err();
                let frame = Frame::Map {
                    pos,
                    entries: Vec::new(),
                    keys: KeyIndex::default(),
                    slot: Slot::Key,
                    bad,
                };
                self.open(frame, pos);
            }
            Event::SequenceEnd | Event::MappingEnd => self.close(),
            Event::Nothing | Event::StreamStart | Event::StreamEnd | Event::DocumentEnd => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(line: usize) -> Pos {
        Pos { line, col: 1 }
    }

    #[test]
    fn key_index_reports_the_first_position_of_a_repeat() {
        let mut keys = KeyIndex::default();
        assert_eq!(keys.insert("a", at(1)), None);
        assert_eq!(keys.insert("b", at(2)), None);
        assert_eq!(keys.insert("a", at(3)), Some(at(1)));
        // A repeat is not recorded: a third `a` still names the first.
        assert_eq!(keys.insert("a", at(4)), Some(at(1)));
        assert_eq!(keys.first.len(), 2);
    }

    #[test]
    fn key_index_is_a_hash_map_not_a_list() {
        // The structural property that makes a mapping linear to read: every key is one
        // hash-map entry, found by hashing, whatever the number of keys before it.
        let mut keys = KeyIndex::default();
        for i in 0..100_000 {
            assert_eq!(keys.insert(&format!("k{i}"), at(i + 1)), None);
        }
        assert_eq!(keys.first.len(), 100_000);
        assert_eq!(keys.insert("k99999", at(1)), Some(at(100_000)));
    }

    #[test]
    fn duplicates_in_a_large_mapping_are_each_reported_once() {
        let mut text = String::from("m:\n");
        for i in 0..50_000 {
            text.push_str(&format!("  k{i}: 1\n"));
        }
        text.push_str("  k7: 2\n  k49999: 3\n");
        let doc = parse(&text);
        let messages: Vec<&str> = doc.errors.iter().map(|e| e.2.as_str()).collect();
        assert_eq!(
            messages,
            [
                "duplicate key `k7` (first defined at line 9)",
                "duplicate key `k49999` (first defined at line 50001)"
            ]
        );
        let Some(Node {
            value: Value::Map(root),
            ..
        }) = &doc.root
        else {
            panic!("root is not a mapping")
        };
        assert!(matches!(&root[0].value.value, Value::Map(m) if m.len() == 50_000));
    }
}
