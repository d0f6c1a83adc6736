//! Compiles every `.proto` file under `proto/` with a pure-Rust compiler (protox),
//! so building Cairn needs no `protoc` on the machine, and writes their encoded
//! `FileDescriptorSet` beside the generated code.

use std::path::{Path, PathBuf};

fn collect(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            if path
                .file_name()
                .is_some_and(|n| n != "src" && n != "target")
            {
                collect(&path, out)?;
            }
        } else if path.extension().is_some_and(|e| e == "proto") {
            out.push(path);
        }
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let mut files = Vec::new();
    collect(&root, &mut files)?;
    files.sort();
    println!("cargo:rerun-if-changed={}", root.display());
    for f in &files {
        println!("cargo:rerun-if-changed={}", f.display());
    }
    if files.is_empty() {
        return Ok(());
    }
    let fds = protox::compile(&files, [&root])?;
    // The descriptors themselves, for code that maps messages by their schema
    // (the HTTP/JSON gateway's protobuf JSON mapping).
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(
        out.join("file_descriptor_set.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    tonic_prost_build::configure()
        // `bytes` fields decode as slices of the receive buffer: no copy of entry data.
        .bytes(".")
        .compile_fds(fds)?;
    Ok(())
}
