//! `tollgate segment build` and `tollgate segment info`: make and inspect the roaring-bitmap
//! files that `segments:` in the config names (see [`crate::segments`]).

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::Path;
use std::process::ExitCode;

use crate::cli::print_out;
use crate::segments::{self, Segment};

/// Builds `out` from the IDs in `from` (`-` reads standard input). Every bad line is
/// reported with its line number and nothing is written, so a half-built segment never
/// ships.
pub fn build(from: &Path, out: &Path) -> ExitCode {
    let reader: Box<dyn Read> = if from.as_os_str() == "-" {
        Box::new(std::io::stdin())
    } else {
        match File::open(from) {
            Ok(f) => Box::new(f),
            Err(e) => {
                eprintln!("{}: cannot read: {e}", from.display());
                return ExitCode::from(1);
            }
        }
    };
    let (segment, report) = match segments::build_from_ids(BufReader::new(reader)) {
        Ok(built) => built,
        Err(e) => {
            eprintln!("{}: {e}", from.display());
            return ExitCode::from(1);
        }
    };
    match segment.write_to(out) {
        Ok(bytes) => {
            if report.ids == 0 {
                eprintln!("warning: the segment is empty: it matches nobody");
            }
            print_out(&format!(
                "{report}\nwrote {} ({bytes} bytes, {})\n",
                out.display(),
                segment.format()
            ))
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(1)
        }
    }
}

/// Prints what a segment file holds.
pub fn info(file: &Path) -> ExitCode {
    match Segment::load(file) {
        Ok(segment) => print_out(&format!("{}\n", segment.info())),
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(1)
        }
    }
}
