//! The segments' tests: membership, both portable formats against files other
//! implementations wrote, the validator's refusals and the CLI's list builder.

use std::collections::BTreeSet;

use proptest::prelude::*;

use super::*;

/// Hex bytes, one field per line, anything after `|` a comment.
fn hex(s: &str) -> Vec<u8> {
    let digits: Vec<u8> = s
        .lines()
        .flat_map(|line| line.split('|').next().unwrap_or("").bytes())
        .filter(u8::is_ascii_hexdigit)
        .collect();
    assert_eq!(digits.len() % 2, 0, "odd number of hex digits");
    digits
        .chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).unwrap())
        .collect()
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/segments")
        .join(name)
}

fn members(segment: &Segment) -> Vec<u64> {
    segment.ids().iter().collect()
}

/// The spec's encoding of `ids`, hand-written in `expected`, must be what the fixture
/// file holds, what `load` reads back as `ids`, and exactly what `build` writes.
fn check_spec_fixture(name: &str, expected: &[u8], ids: &[u64], format: SegmentFormat) {
    let path = fixture(name);
    assert_eq!(
        std::fs::read(&path).unwrap(),
        expected,
        "{name} is not the hand-written hex"
    );
    let loaded = Segment::load(&path).unwrap();
    assert_eq!(members(&loaded), ids);
    assert_eq!(loaded.format(), format);
    assert_eq!(loaded.info().bytes, expected.len() as u64);
    let built = Segment::from_ids(ids.iter().copied());
    assert_eq!(built.format(), format);
    assert_eq!(
        built.to_bytes(),
        expected,
        "build does not write the spec's encoding"
    );
    assert_eq!(built.info().bytes, expected.len() as u64);
}

const ARRAY_HEX: &str = "
    3a300000 | cookie 12346: no run containers
    02000000 | 2 containers
    0000 0200 | container 0: key 0, cardinality 3 - 1
    0100 0000 | container 1: key 1, cardinality 1 - 1
    18000000 | offset of container 0: 24 = 4 + 4 + 2 * 8
    1e000000 | offset of container 1: 24 + 3 * 2
    0100 0500 e803 | array: 1, 5, 1000
    0300 | array: 3 (the ID 65536 + 3)";

#[test]
fn reads_and_writes_the_spec_array_encoding() {
    check_spec_fixture(
        "array.roaring",
        &hex(ARRAY_HEX),
        &[1, 5, 1000, 65539],
        SegmentFormat::Portable32,
    );
}

/// Key 3, the even numbers of [0, 10000): 5000 > 4096 values, so a bitmap container.
fn bitmap_bytes() -> Vec<u8> {
    let mut bytes = hex("
        3a300000 | cookie 12346
        01000000 | 1 container
        0300 8713 | key 3, cardinality 5000 - 1 = 0x1387
        10000000 | offset 16");
    // Word j holds values 64j..64j+63, bit i for value 64j + i: evens are 0x5555...
    for _ in 0..156 {
        bytes.extend(hex("5555555555555555"));
    }
    bytes.extend(hex("5555000000000000")); // 9984..=9998: 8 evens, bits 0..=14
    bytes.extend(std::iter::repeat_n(0u8, 867 * 8)); // 156 + 1 + 867 = 1024 words
    bytes
}

#[test]
fn reads_and_writes_the_spec_bitmap_encoding() {
    let ids: Vec<u64> = (0..5000).map(|k| 3 * 65536 + 2 * k).collect();
    check_spec_fixture(
        "bitmap.roaring",
        &bitmap_bytes(),
        &ids,
        SegmentFormat::Portable32,
    );
}

const RUNS_HEX: &str = "
    3b300100 | cookie 12347, 2 containers - 1 in the high 16 bits
    01 | run flags: container 0 is a run container
    0000 6e00 | key 0, cardinality 111 - 1
    0200 0000 | key 2, cardinality 1 - 1
              | no offsets: fewer than 4 containers
    0200 | 2 runs
    0a00 0a00 | 10, 10 more: 10..=20
    6400 6300 | 100, 99 more: 100..=199
    0700 | array: 7 (the ID 2 * 65536 + 7)";

#[test]
fn reads_and_writes_the_spec_run_encoding() {
    let mut ids: Vec<u64> = (10..=20).chain(100..=199).collect();
    ids.push(2 * 65536 + 7);
    check_spec_fixture(
        "runs.roaring",
        &hex(RUNS_HEX),
        &ids,
        SegmentFormat::Portable32,
    );
}

const RUNS_OFFSETS_HEX: &str = "
    3b300300 | cookie 12347, 4 containers - 1
    09 | run flags: containers 0 and 3
    0000 6300 | key 0, cardinality 100 - 1
    0100 0000 | key 1, cardinality 1 - 1
    0200 0000 | key 2, cardinality 1 - 1
    0300 ffff | key 3, cardinality 65536 - 1
    25000000 | offsets, 4 containers or more: 37 = 4 + 1 + 4 * 8
    2b000000 | 43 = 37 + 2 + 4
    2d000000 | 45
    2f000000 | 47
    0100 0000 6300 | 1 run: 0..=99
    0100 | array: 1
    0200 | array: 2
    0100 0000 ffff | 1 run: 0..=65535";

#[test]
fn reads_and_writes_the_spec_run_encoding_with_offsets() {
    let mut ids: Vec<u64> = (0..100).collect();
    ids.extend([65536 + 1, 2 * 65536 + 2]);
    ids.extend(3 * 65536..4 * 65536);
    check_spec_fixture(
        "runs_offsets.roaring",
        &hex(RUNS_OFFSETS_HEX),
        &ids,
        SegmentFormat::Portable32,
    );
}

const WIDE64_HEX: &str = "
    0300000000000000 | 3 buckets (u64)
    00000000 | bucket key 0
    3a300000 01000000 0000 0000 10000000 0700 | 32-bit bitmap {7}
    01000000 | bucket key 1
    3a300000 01000000 0000 0000 10000000 0700 | {7}
    05000000 | bucket key 5
    3a300000 01000000 0000 0200 10000000 0000 0100 0200 | {0, 1, 2}: array, as
             | runs would be no smaller (2 + 4 bytes)";

#[test]
fn reads_and_writes_the_64_bit_extension() {
    let ids = [7, (1 << 32) | 7, 5 << 32, (5 << 32) | 1, (5 << 32) | 2];
    check_spec_fixture(
        "wide64.roaring",
        &hex(WIDE64_HEX),
        &ids,
        SegmentFormat::Portable64,
    );
}

#[test]
fn writes_32_bit_whenever_every_id_fits() {
    assert_eq!(
        Segment::from_ids([u64::from(u32::MAX)]).format(),
        SegmentFormat::Portable32
    );
    assert_eq!(
        Segment::from_ids([1 << 32]).format(),
        SegmentFormat::Portable64
    );
    assert_eq!(
        Segment::from_ids([0, u64::MAX]).format(),
        SegmentFormat::Portable64
    );
    let empty = Segment::from_ids([]);
    assert_eq!(empty.to_bytes(), hex("3a300000 00000000"));
    let loaded = Segment::from_bytes(&empty.to_bytes()).unwrap();
    assert!(loaded.is_empty());
    assert_eq!(loaded.format(), SegmentFormat::Portable32);
    assert!(!loaded.contains(0));
}

#[test]
fn a_64_bit_file_that_starts_like_a_32_bit_cookie_still_loads() {
    // 12346 buckets: the bucket count's first 4 bytes are cookie 12346.
    let ids: Vec<u64> = (0..12346u64).map(|k| k << 32 | k).collect();
    let bytes = Segment::from_ids(ids.iter().copied()).to_bytes();
    assert_eq!(bytes[..8], hex("3a300000 00000000")[..]);
    let loaded = Segment::from_bytes(&bytes).unwrap();
    assert_eq!(loaded.format(), SegmentFormat::Portable64);
    assert_eq!(members(&loaded), ids);
}

#[test]
fn round_trip_build_write_load() {
    let dir = tempfile::tempdir().unwrap();
    let input = "# VIPs\n42\n7\n\n 1000000 \r\n4294967296 # a 64-bit one\n7\n";
    let (built, report) = build_from_ids(input.as_bytes()).unwrap();
    assert_eq!(
        report,
        BuildReport {
            lines: 7,
            ids: 4,
            duplicates: 1,
            skipped: 2
        }
    );
    let path = dir.path().join("vip.roaring");
    let written = built.write_to(&path).unwrap();
    assert_eq!(written, std::fs::metadata(&path).unwrap().len());
    let loaded = Segment::load(&path).unwrap();
    assert_eq!(members(&loaded), [7, 42, 1_000_000, 1 << 32]);
    assert_eq!(loaded.format(), SegmentFormat::Portable64);
    assert_eq!(loaded.info(), built.info());

    // Overwriting replaces the file and leaves no temporary file behind.
    let smaller = Segment::from_ids([3]);
    smaller.write_to(&path).unwrap();
    assert_eq!(members(&Segment::load(&path).unwrap()), [3]);
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["vip.roaring"]);
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(
        mode & 0o444,
        0o444,
        "mode {mode:o}: other users (the proxy) must read it"
    );
}

#[test]
fn writing_into_a_missing_directory_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nope/vip.roaring");
    let err = Segment::from_ids([1]).write_to(&path).unwrap_err();
    assert!(matches!(err, SegmentError::Unwritable { .. }), "{err:?}");
    assert!(err.to_string().contains("nope/vip.roaring"), "{err}");
}

#[test]
fn membership_of_integer_and_non_integer_values() {
    let segment = Segment::from_ids([0, 7, 42, 1 << 40, u64::MAX]);
    for member in [
        "0",
        "7",
        "42",
        "007",
        "1099511627776",
        "18446744073709551615",
    ] {
        assert!(segment.contains_bytes(member.as_bytes()), "{member:?}");
    }
    for outsider in [
        "",
        "8",
        "-7",
        "+7",
        " 7",
        "7 ",
        "7\n",
        "4 2",
        "42.0",
        "0x2a",
        "4_2",
        "abc",
        "٧",
        "18446744073709551616",
        "99999999999999999999999",
    ] {
        assert!(!segment.contains_bytes(outsider.as_bytes()), "{outsider:?}");
    }
    assert!(!segment.contains_bytes(&[b'4', 0xff]));
    assert!(segment.contains(u64::MAX) && segment.contains(1 << 40) && !segment.contains(1));
}

fn write_file(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

fn corrupt_error(bytes: &[u8]) -> FormatError {
    let dir = tempfile::tempdir().unwrap();
    let path = write_file(dir.path(), "bad.roaring", bytes);
    match Segment::load(&path) {
        Err(err @ SegmentError::Corrupt { .. }) => {
            let message = err.to_string();
            assert!(message.contains(&*path.to_string_lossy()), "{message}");
            let SegmentError::Corrupt { source, .. } = err else {
                unreachable!()
            };
            source
        }
        other => panic!("expected a Corrupt error, got {other:?}"),
    }
}

#[test]
fn missing_unreadable_and_too_large_files_are_refused_with_their_path() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.roaring");
    let err = Segment::load(&missing).unwrap_err();
    assert!(matches!(err, SegmentError::Missing { .. }), "{err:?}");
    assert!(err.to_string().contains("missing.roaring") && err.to_string().contains("not found"));

    let err = Segment::load(dir.path()).unwrap_err();
    assert!(matches!(err, SegmentError::Unreadable { .. }), "{err:?}");
    assert!(
        err.to_string().contains(&*dir.path().to_string_lossy()),
        "{err}"
    );

    // A sparse file: no gigabyte is written, and none is read.
    let huge = dir.path().join("huge.roaring");
    File::create(&huge)
        .unwrap()
        .set_len(MAX_FILE_BYTES + 1)
        .unwrap();
    let err = Segment::load(&huge).unwrap_err();
    assert!(matches!(err, SegmentError::TooLarge { size, .. } if size == MAX_FILE_BYTES + 1));
    assert!(err.to_string().contains("huge.roaring"), "{err}");
}

#[test]
fn corrupt_truncated_and_trailing_files_are_refused() {
    let good = hex(RUNS_OFFSETS_HEX);
    assert!(matches!(
        corrupt_error(b""),
        FormatError::Truncated { offset: 0, .. }
    ));
    assert!(matches!(
        corrupt_error(b"customer_id\n42\n"),
        FormatError::NotRoaring { first: 0x7473_7563 }
    ));
    assert!(matches!(
        corrupt_error(&good[..good.len() - 1]),
        FormatError::Truncated { what: "runs", .. }
    ));
    let mut trailing = good.clone();
    trailing.push(0);
    assert_eq!(
        corrupt_error(&trailing),
        FormatError::TrailingBytes {
            offset: 53,
            extra: 1
        }
    );
    let mut wide_trailing = hex(WIDE64_HEX);
    wide_trailing.extend([1, 2, 3]);
    assert_eq!(
        corrupt_error(&wide_trailing),
        FormatError::TrailingBytes {
            offset: 78,
            extra: 3
        }
    );
    // The message an operator reads says what and where.
    let message = corrupt_error(&good[..40]).to_string();
    assert!(
        message.contains("truncated") && message.contains("byte 39"),
        "{message}"
    );
}

/// `good` with bytes from `at` replaced by `patch`.
fn patched(good: &[u8], at: usize, patch: &str) -> Vec<u8> {
    let mut bytes = good.to_vec();
    let patch = hex(patch);
    bytes[at..at + patch.len()].copy_from_slice(&patch);
    bytes
}

fn problem(bytes: &[u8]) -> String {
    match Segment::from_bytes(bytes) {
        Err(FormatError::Invalid { problem, .. }) => problem,
        other => panic!("expected an Invalid error, got {other:?}"),
    }
}

#[test]
fn every_rule_of_the_format_is_checked() {
    let array = hex(ARRAY_HEX);
    let runs = hex(RUNS_OFFSETS_HEX);
    let wide = hex(WIDE64_HEX);
    let cases: [(Vec<u8>, &str); 12] = [
        (patched(&array, 16, "19000000"), "should start at byte 25"),
        (
            patched(&array, 12, "0000"),
            "keys not increasing: 0 after 0",
        ),
        (
            patched(&array, 24, "0500 0100"),
            "not increasing: 1 after 5",
        ),
        (
            patched(&array, 24, "0100 0100"),
            "not increasing: 1 after 1",
        ),
        (patched(&array, 4, "01000100"), "65537 containers"),
        (
            patched(&runs, 37, "0100 0000 6400"),
            "holds 101 values, its header says 100",
        ),
        (patched(&runs, 47, "0100 0100 ffff"), "passes 65535"),
        (patched(&runs, 37, "0000"), "with no runs"),
        (patched(&runs, 4, "19"), "flags set past the last container"),
        (
            patched(&bitmap_bytes(), 16, "57"),
            "has 5001 bits set, its header says 5000",
        ),
        (
            patched(&wide, 30, "00000000"),
            "bucket keys not increasing: 0 after 0",
        ),
        (patched(&wide, 34, "3c300000"), "unknown cookie 0x0000303c"),
    ];
    for (bytes, expected) in cases {
        let problem = problem(&bytes);
        assert!(
            problem.contains(expected),
            "{problem:?} should say {expected:?}"
        );
    }
    // Touching runs (10..=20 then 21..=30): one run really, refused.
    let touching = hex("3b300000 01 0000 1400 | 1 run container, 21 values
                        0200 0a00 0a00 1500 0900 | 10..=20, 21..=30");
    assert!(problem(&touching).contains("overlaps, touches"));
    let unsorted = hex("3b300000 01 0000 0100 0200 0a00 0000 0500 0000 | runs 10, 5");
    assert!(problem(&unsorted).contains("precedes"));
}

#[test]
fn empty_buckets_in_a_64_bit_file_are_accepted_and_dropped() {
    let bytes = hex("
        0200000000000000 | 2 buckets
        00000000 3a300000 00000000 | key 0: an empty bitmap
        09000000 3a300000 01000000 0000 0000 10000000 0100 | key 9: {1}");
    let segment = Segment::from_bytes(&bytes).unwrap();
    assert_eq!(members(&segment), [9 << 32 | 1]);
    assert_eq!(segment.info().buckets, 1);
}

#[test]
fn build_reports_every_bad_line_with_its_number() {
    let input = b"1\nabc\n2\n-3\n18446744073709551616\n4 5\n\xff\n# fine\n";
    let Err(BuildError::BadLines(bad)) = build_from_ids(&input[..]) else {
        panic!("bad lines must fail the build");
    };
    assert_eq!(bad.total, 5);
    let lines: Vec<(u64, &str, LineProblem)> = bad
        .shown
        .iter()
        .map(|b| (b.line, b.text.as_str(), b.problem))
        .collect();
    assert_eq!(
        lines,
        [
            (2, "abc", LineProblem::NotDecimal),
            (4, "-3", LineProblem::NotDecimal),
            (5, "18446744073709551616", LineProblem::TooLarge),
            (6, "4 5", LineProblem::NotDecimal),
            (7, "\u{fffd}", LineProblem::NotDecimal),
        ]
    );
    let message = BuildError::BadLines(bad).to_string();
    assert!(message.starts_with("5 bad lines in the ID list, so no segment was built:"));
    assert!(
        message.contains("line 5: \"18446744073709551616\": above the largest"),
        "{message}"
    );
}

#[test]
fn build_bounds_the_bad_lines_it_lists_and_the_lines_it_buffers() {
    let mut input = String::new();
    for i in 0..250 {
        input.push_str(&format!("id{i}\n"));
    }
    input.push_str(&"9".repeat(MAX_LINE_BYTES * 10));
    input.push_str("\n12\n");
    let Err(BuildError::BadLines(bad)) = build_from_ids(input.as_bytes()) else {
        panic!("bad lines must fail the build");
    };
    assert_eq!(bad.total, 251);
    assert_eq!(bad.shown.len(), MAX_REPORTED_BAD_LINES);
    assert_eq!(bad.shown[99].line, 100);
    assert!(bad.to_string().ends_with("... and 151 more"), "{bad}");

    // An over-long line is reported, its rest skipped, and the next line read.
    let input = format!("1\n{}\n2\n", "7".repeat(MAX_LINE_BYTES + 1));
    let Err(BuildError::BadLines(bad)) = build_from_ids(input.as_bytes()) else {
        panic!("a long line must fail the build");
    };
    assert_eq!(bad.total, 1);
    assert_eq!(
        (bad.shown[0].line, bad.shown[0].problem),
        (2, LineProblem::TooLong)
    );
    assert!(bad.shown[0].text.ends_with('…'));
    // At the limit is fine (leading zeros).
    let input = format!("{}42\n", "0".repeat(MAX_LINE_BYTES - 2));
    let (segment, _) = build_from_ids(input.as_bytes()).unwrap();
    assert_eq!(members(&segment), [42]);
}

#[test]
fn build_reports_read_errors() {
    struct Failing;
    impl Read for Failing {
        fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
            Err(io::Error::other("disk on fire"))
        }
    }
    let err = build_from_ids(io::BufReader::new(Failing)).unwrap_err();
    assert!(matches!(err, BuildError::Read { line: 0, .. }), "{err:?}");
    assert!(err.to_string().contains("disk on fire"));
}

#[test]
fn info_summarises_a_segment() {
    let segment = Segment::from_bytes(&hex(RUNS_OFFSETS_HEX)).unwrap();
    let info = segment.info();
    assert_eq!(
        info,
        SegmentInfo {
            cardinality: 100 + 2 + 65536,
            bytes: 53,
            min: Some(0),
            max: Some(4 * 65536 - 1),
            format: SegmentFormat::Portable32,
            buckets: 1,
            containers: ContainerCounts {
                array: 2,
                bitmap: 0,
                run: 2
            },
        }
    );
    let text = info.to_string();
    for line in [
        "format:      roaring 32-bit portable",
        "ids:         65638",
        "min:         0",
        "max:         262143",
        "bytes:       53 (0.00 per id)",
        "buckets:     1 (distinct high 32 bits)",
        "containers:  4 (2 array, 0 bitmap, 2 run)",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "no line {line:?} in\n{text}"
        );
    }
    let empty = Segment::from_ids([]).info().to_string();
    assert!(
        empty.contains("min:         -\n") && empty.contains("bytes:       8\n"),
        "{empty}"
    );
}

/// IDs that exercise every container kind and both formats: clustered runs, sparse
/// values, dense blocks, and a few 64-bit ones.
fn arb_ids() -> impl Strategy<Value = Vec<u64>> {
    let small = prop_oneof![
        (0u64..300_000),
        (0u64..u64::from(u32::MAX)),
        (0u64..8).prop_map(|k| k << 32 | 5),
        any::<u64>(),
    ];
    let ranges = (0u64..400_000, 1u64..9000).prop_map(|(s, n)| (s..s + n).collect::<Vec<_>>());
    (
        prop::collection::vec(small, 0..300),
        prop::collection::vec(ranges, 0..3),
    )
        .prop_map(|(mut ids, ranges)| {
            ids.extend(ranges.into_iter().flatten());
            ids
        })
}

/// `u64::from_str`, minus the `+` it accepts.
fn reference_parse(value: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(value).ok()?;
    if text.starts_with('+') {
        return None;
    }
    text.parse().ok()
}

proptest! {
    // Debug builds of roaring are slow on the 9000-ID ranges: 64 cases keep each
    // property near a second.
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn membership_matches_a_set(ids in arb_ids(), probes in prop::collection::vec(any::<u64>(), 0..50)) {
        let segment = Segment::from_ids(ids.iter().copied());
        let model: BTreeSet<u64> = ids.iter().copied().collect();
        prop_assert_eq!(segment.len(), model.len() as u64);
        for id in ids.iter().chain(&probes).copied().chain(probes.iter().map(|p| p % 400_000)) {
            prop_assert_eq!(segment.contains(id), model.contains(&id));
            prop_assert_eq!(segment.contains_bytes(id.to_string().as_bytes()), model.contains(&id));
        }
    }

    #[test]
    fn round_trips_through_bytes(ids in arb_ids()) {
        let built = Segment::from_ids(ids.iter().copied());
        let bytes = built.to_bytes();
        prop_assert_eq!(bytes.len() as u64, built.info().bytes);
        let loaded = Segment::from_bytes(&bytes).unwrap();
        prop_assert_eq!(loaded.ids(), built.ids());
        prop_assert_eq!(loaded.format(), SegmentFormat::for_max(built.ids().max()));
        prop_assert_eq!(loaded.to_bytes(), bytes);
    }

    #[test]
    fn truncations_and_trailing_bytes_are_refused(
        ids in arb_ids(),
        cut in any::<prop::sample::Index>(),
        extra in prop::collection::vec(any::<u8>(), 1..16),
    ) {
        let bytes = Segment::from_ids(ids).to_bytes();
        let cut = cut.index(bytes.len());
        prop_assert!(Segment::from_bytes(&bytes[..cut]).is_err(), "prefix of {} bytes", cut);
        let mut longer = bytes.clone();
        longer.extend(&extra);
        prop_assert!(Segment::from_bytes(&longer).is_err());
    }

    #[test]
    fn corrupted_valid_files_never_panic(
        ids in arb_ids(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 1..4),
        headed in any::<bool>(),
    ) {
        let mut bytes = Segment::from_ids(ids).to_bytes();
        let reach = if headed { bytes.len().min(64) } else { bytes.len() };
        for (at, mask) in flips {
            bytes[at.index(reach)] ^= mask;
        }
        if let Ok(segment) = Segment::from_bytes(&bytes) {
            // A flip can turn one valid set into another; the result must be coherent.
            let again = Segment::from_bytes(&segment.to_bytes()).unwrap();
            prop_assert_eq!(again.ids(), segment.ids());
        }
    }
}

proptest! {
    // Cheap properties: many cases.
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn parse_id_matches_the_standard_parser(
        value in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..24),
            "[0-9]{0,22}".prop_map(String::into_bytes),
            "[-+ 0-9]{0,6}".prop_map(String::into_bytes),
        ]
    ) {
        prop_assert_eq!(parse_id(&value), reference_parse(&value));
    }

    #[test]
    fn random_bytes_never_panic(
        head in prop::sample::select(vec![
            "",
            "3a300000 01000000 | 12346, 1 container",
            "3a300000 03000000 | 12346, 3 containers",
            "3b300000 | 12347, 1 container",
            "3b300400 | 12347, 5 containers",
            "0100000000000000 00000000 3a300000 01000000 | 1 bucket, 1 container",
            "0200000000000000 00000000 3b300100 | 2 buckets, 12347",
        ]),
        tail in prop::collection::vec(any::<u8>(), 0..256),
    ) {
        // A valid start, then random bytes, so that fuzzing reaches past the cookie.
        let mut bytes = hex(head);
        bytes.extend(tail);
        // Random bytes can be valid (eight zero bytes are an empty 64-bit bitmap); if so
        // they must read as what they encode.
        if let Ok(segment) = Segment::from_bytes(&bytes) {
            let again = Segment::from_bytes(&segment.to_bytes()).unwrap();
            prop_assert_eq!(again.ids(), segment.ids());
        }
    }
}
