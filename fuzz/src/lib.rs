//! Fuzzing of every memarts decoder with cargo-fuzz / libFuzzer. What a target checks lives here, so
//! the seed generator and the tests run exactly the checks the fuzzer runs:
//! - [`frame`]: the wire frame (head limits, message, torn and split input), read whole, in pieces
//!   (sync, resumed head, async), all of which must agree; a frame that decodes is re-encoded and
//!   must read back the same.
//! - [`message`]: `Request` / `Response` decoding (postcard); a decoded message must re-encode to a
//!   canonical form that decodes to the same value, and what the proxy computes right after decoding
//!   (chunk ranges, URL parsing) must hold its invariants.
//! - [`chunk_header`]: the on-disk chunk header and its identity encoding; a header that decodes
//!   re-encodes to the very bytes it was read from.
//! - [`samples`]: valid values of every kind, from which `examples/seeds.rs` writes `corpus/`.
//!
//! Each check panics (which libFuzzer reports as a crash) on a panic inside a decoder or on a broken
//! invariant; it returns normally when the input is rejected cleanly.

pub mod chunk_header;
pub mod frame;
pub mod message;
pub mod samples;

/// One fuzz target: its name (as in `Cargo.toml` and `fuzz_targets/`), its check and its seeds.
pub struct Target {
    pub name: &'static str,
    pub check: fn(&[u8]),
    pub seeds: fn() -> Vec<Vec<u8>>,
}

/// Every fuzz target.
pub const TARGETS: [Target; 3] = [
    Target { name: "frame", check: frame::check, seeds: frame::seeds },
    Target { name: "message", check: message::check, seeds: message::seeds },
    Target { name: "chunk_header", check: chunk_header::check, seeds: chunk_header::seeds },
];

#[cfg(test)]
mod tests {
    use std::path::Path;

    /// The committed corpus is what `cargo run --example seeds` writes today, and every seed passes its
    /// target's checks.
    #[test]
    fn committed_corpus_is_current_and_passes() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
        for target in &super::TARGETS {
            let seeds = (target.seeds)();
            let committed = std::fs::read_dir(root.join(target.name)).unwrap();
            let names = committed.map(|e| e.unwrap().file_name().into_string().unwrap());
            let count = names.filter(|name| name.starts_with("seed-")).count();
            assert_eq!(
                count,
                seeds.len(),
                "corpus/{} is stale: run `cargo run --example seeds`",
                target.name
            );
            for (i, seed) in seeds.iter().enumerate() {
                (target.check)(seed);
                let path = root.join(target.name).join(format!("seed-{i:02}"));
                let committed = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                assert_eq!(&committed, seed, "{} is stale: run `cargo run --example seeds`", path.display());
            }
        }
    }
}
