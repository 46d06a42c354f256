//! Compiles the `.proto` files without a system `protoc`: protox parses them in pure Rust and
//! tonic-prost-build generates the code from the descriptor sets.
//!
//! - `proto/hasync/v1/*.proto`: hasync's own API (messages, clients and servers), and its
//!   descriptor set for gRPC reflection (hasync's packages only).
//! - `proto/etcd/...`: the subset of etcd v3's API the coordinator speaks (clients only).

use std::env;
use std::path::{Path, PathBuf};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // compile_fds emits no rerun-if-changed of its own.
    println!("cargo:rerun-if-changed=proto");
    let out = PathBuf::from(env::var("OUT_DIR")?);

    let compiler = compile(&protos_in("proto/hasync/v1")?)?;
    // file_descriptor_set_path() is ignored by compile_fds: write the set for reflection ourselves.
    std::fs::write(out.join("hasync_descriptor.bin"), compiler.encode_file_descriptor_set())?;
    // bytes fields as `bytes::Bytes`: message bodies move without copies.
    tonic_prost_build::configure().bytes(".").compile_fds(compiler.file_descriptor_set())?;

    let etcd = compile(&[PathBuf::from("etcd/etcdserverpb/rpc.proto")])?;
    tonic_prost_build::configure().build_server(false).compile_fds(etcd.file_descriptor_set())?;
    Ok(())
}

/// The `.proto` files of one directory, relative to `proto/`, sorted.
fn protos_in(dir: &str) -> Result<Vec<PathBuf>, Box<dyn std::error::Error>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "proto"))
        .map(|p| p.strip_prefix("proto").map(PathBuf::from).unwrap_or(p))
        .collect();
    files.sort();
    Ok(files)
}

/// Parses `files` (and what they import) with `proto/` as the include root.
fn compile(files: &[PathBuf]) -> Result<protox::Compiler, Box<dyn std::error::Error>> {
    let mut compiler = protox::Compiler::new([Path::new("proto")])?;
    compiler.include_imports(true).include_source_info(true);
    for f in files {
        compiler.open_file(f)?;
    }
    Ok(compiler)
}
