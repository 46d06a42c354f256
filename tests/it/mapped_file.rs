//! Segment files and their queue: create, lookup, read, truncate, logs that start past 0.

use std::sync::Arc;

use hasync::store::fs::{FileSystem, StdFs};
use hasync::store::mapped_file::{MappedFile, file_name, parse_file_name};
use hasync::store::mapped_file_queue::MappedFileQueue;

const SEG: usize = 64 * 1024;

fn fs() -> Arc<dyn FileSystem> {
    Arc::new(StdFs)
}

#[test]
fn file_names_are_20_digit_offsets() {
    assert_eq!(file_name(0), "00000000000000000000");
    assert_eq!(file_name(1_073_741_824), "00000000001073741824");
    assert_eq!(parse_file_name("00000000005368709120"), Some(5_368_709_120));
    assert_eq!(parse_file_name("0000000000536870912"), None);
    assert_eq!(parse_file_name("checkpoint"), None);
    assert_eq!(parse_file_name("0000000000536870912x"), None);
}

#[test]
fn created_file_is_allocated_and_empty() {
    let dir = tempfile::tempdir().unwrap();
    let f = MappedFile::create(fs(), dir.path(), 0, SEG).unwrap();
    let meta = std::fs::metadata(f.path()).unwrap();
    assert_eq!(meta.len(), SEG as u64);
    // Really allocated, not sparse: the blocks cover the whole file.
    use std::os::unix::fs::MetadataExt;
    assert!(meta.blocks() * 512 >= SEG as u64, "file is sparse: {} blocks", meta.blocks());
    assert_eq!((f.wrote_pos(), f.flushed_pos(), f.remaining()), (0, 0, SEG));
    assert!(f.read(0, 100).is_none());
}

#[test]
fn append_read_flush_positions() {
    let dir = tempfile::tempdir().unwrap();
    let f = MappedFile::create(fs(), dir.path(), SEG as u64, SEG).unwrap();
    assert_eq!(f.append(b"hello"), 0);
    assert_eq!(f.append(b"world"), 5);
    assert_eq!(&f.read(0, 100).unwrap()[..], b"helloworld");
    assert_eq!(&f.read(3, 4).unwrap()[..], b"lowo");
    assert!(f.read(10, 1).is_none());
    assert_eq!(f.flushed_pos(), 0);
    assert_eq!(f.flush().unwrap(), 10);
    assert_eq!(f.flushed_pos(), 10);
    // Bytes survive a reopen.
    let path = f.path().to_path_buf();
    drop(f);
    let g = MappedFile::open(fs(), &path, SEG as u64, SEG).unwrap();
    assert_eq!(&g.raw(0, 10)[..], b"helloworld");
}

#[test]
fn reader_slice_outlives_the_file_handle() {
    let dir = tempfile::tempdir().unwrap();
    let f = MappedFile::create(fs(), dir.path(), 0, SEG).unwrap();
    f.append(b"abc");
    let slice = f.read(0, 3).unwrap();
    f.remove().unwrap();
    drop(f);
    assert_eq!(&slice[..], b"abc", "the mapping stays alive while a reader holds it");
}

#[test]
fn wrong_file_size_is_refused_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(file_name(0));
    std::fs::write(&path, vec![0u8; 1000]).unwrap();
    let err = MappedFile::open(fs(), &path, 0, SEG).unwrap_err().to_string();
    assert!(err.contains("00000000000000000000") && err.contains("1000 bytes"), "{err}");
}

#[test]
fn truncate_zeroes_the_tail() {
    let dir = tempfile::tempdir().unwrap();
    let f = MappedFile::create(fs(), dir.path(), 0, SEG).unwrap();
    f.append(&[7u8; 10_000]);
    f.truncate(100).unwrap();
    assert_eq!(f.wrote_pos(), 100);
    assert!(f.raw(100, SEG - 100).iter().all(|&b| b == 0));
    assert!(f.raw(0, 100).iter().all(|&b| b == 7));
}

#[test]
fn queue_creates_finds_and_rolls_from_a_non_zero_start() {
    let dir = tempfile::tempdir().unwrap();
    let q = MappedFileQueue::load(fs(), dir.path(), SEG).unwrap();
    assert!(q.is_empty());
    assert_eq!(q.min_offset(), None);
    let start = 5 * SEG as u64;
    let f = q.last_or_create(start + 123).unwrap();
    assert_eq!(f.from_offset(), start, "aligned down to the segment");
    f.append(&vec![1u8; SEG]);
    let g = q.last_or_create(0).unwrap();
    assert_eq!(g.from_offset(), start + SEG as u64);
    g.append(b"xyz");
    assert_eq!(q.min_offset(), Some(start));
    assert_eq!(q.max_offset(), Some(start + SEG as u64 + 3));
    assert_eq!(q.find(start).unwrap().from_offset(), start);
    assert_eq!(q.find(start + SEG as u64 - 1).unwrap().from_offset(), start);
    assert_eq!(q.find(start + SEG as u64).unwrap().from_offset(), start + SEG as u64);
    assert!(q.find(start - 1).is_none());
    assert!(q.find(start + 2 * SEG as u64).is_none());
    assert!(q.create(start + 7).is_err(), "unaligned start refused");
    // Reload finds the same files.
    drop((f, g, q));
    let q = MappedFileQueue::load(fs(), dir.path(), SEG).unwrap();
    assert_eq!(q.len(), 2);
    assert_eq!(q.min_offset(), Some(start));
}

#[test]
fn queue_truncate_cuts_the_holding_file_and_removes_later_ones() {
    let dir = tempfile::tempdir().unwrap();
    let q = MappedFileQueue::load(fs(), dir.path(), SEG).unwrap();
    for _ in 0..3 {
        let f = q.last_or_create(0).unwrap();
        f.append(&vec![9u8; SEG]);
    }
    assert_eq!(q.len(), 3);
    let removed = q.truncate(SEG as u64 + 10).unwrap();
    assert_eq!(removed.len(), 1);
    assert_eq!(q.len(), 2);
    assert_eq!(q.max_offset(), Some(SEG as u64 + 10));
    assert!(!dir.path().join(file_name(2 * SEG as u64)).exists());
    // Cutting at a file's start removes that file, keeps the previous one full.
    q.truncate(SEG as u64).unwrap();
    assert_eq!(q.len(), 1);
    assert_eq!(q.max_offset(), Some(SEG as u64));
    // The first file is kept (empty) so the log keeps its start.
    q.truncate(0).unwrap();
    assert_eq!((q.len(), q.max_offset()), (1, Some(0)));
}

#[test]
fn queue_load_refuses_a_gap_naming_both_files() {
    let dir = tempfile::tempdir().unwrap();
    {
        let q = MappedFileQueue::load(fs(), dir.path(), SEG).unwrap();
        q.create(0).unwrap();
        q.create(SEG as u64).unwrap();
        q.create(2 * SEG as u64).unwrap();
    }
    std::fs::remove_file(dir.path().join(file_name(SEG as u64))).unwrap();
    let err = MappedFileQueue::load(fs(), dir.path(), SEG).unwrap_err().to_string();
    assert!(err.contains("gap"), "{err}");
    assert!(err.contains(&file_name(2 * SEG as u64)), "{err}");
}

#[test]
fn queue_remove_first_never_removes_the_last_file() {
    let dir = tempfile::tempdir().unwrap();
    let q = MappedFileQueue::load(fs(), dir.path(), SEG).unwrap();
    q.create(0).unwrap().append(&vec![1u8; SEG]);
    q.create(SEG as u64).unwrap();
    assert!(q.remove_first().unwrap().is_some());
    assert_eq!(q.min_offset(), Some(SEG as u64));
    assert!(q.remove_first().unwrap().is_none());
    assert_eq!(q.len(), 1);
}

#[test]
fn the_next_segment_is_allocated_ahead_and_renamed_into_place() {
    let dir = tempfile::tempdir().unwrap();
    let spare = dir.path().join(format!("{}.prealloc", file_name(SEG as u64)));
    {
        let q = MappedFileQueue::load(fs(), dir.path(), SEG).unwrap();
        q.create(0).unwrap().append(&vec![1u8; SEG]);
        assert!(q.prepare_next(true).unwrap());
        assert!(!q.prepare_next(true).unwrap(), "one spare at a time");
        assert!(spare.exists());
        let next = q.create(SEG as u64).unwrap();
        assert!(!spare.exists() && next.path().ends_with(file_name(SEG as u64)));
        next.append(b"x");
        assert!(q.prepare_next(true).unwrap());
    }
    // A spare left by an earlier run is removed at load, and never counts as a segment.
    let q = MappedFileQueue::load(fs(), dir.path(), SEG).unwrap();
    assert_eq!(q.len(), 2);
    assert!(
        std::fs::read_dir(dir.path()).unwrap().all(|e| !e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .ends_with(".prealloc"))
    );
}
