//! Compiles `proto/hasync/v1/*.proto` without a system `protoc`: protox parses the files in pure
//! Rust and tonic-prost-build generates the messages and services from the descriptor set.

use std::env;
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // compile_fds emits no rerun-if-changed of its own.
    println!("cargo:rerun-if-changed=proto");
    let out = PathBuf::from(env::var("OUT_DIR")?);
    let mut files: Vec<PathBuf> = std::fs::read_dir("proto/hasync/v1")?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "proto"))
        .map(|p| p.strip_prefix("proto").map(PathBuf::from).unwrap_or(p))
        .collect();
    files.sort();
    let mut compiler = protox::Compiler::new(["proto"])?;
    compiler.include_imports(true).include_source_info(true);
    for f in &files {
        compiler.open_file(f)?;
    }
    // file_descriptor_set_path() is ignored by compile_fds: write the set for reflection ourselves.
    std::fs::write(out.join("hasync_descriptor.bin"), compiler.encode_file_descriptor_set())?;
    // bytes fields as `bytes::Bytes`: message bodies move without copies.
    tonic_prost_build::configure().bytes(".").compile_fds(compiler.file_descriptor_set())?;
    Ok(())
}
