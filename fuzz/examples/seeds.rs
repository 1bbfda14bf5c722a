//! Writes the seed corpus, `corpus/<target>/seed-NN`, from `memarts_fuzz::TARGETS`; run it from
//! `fuzz/` with `cargo run --example seeds` after a change of encoding or of the samples. Every seed is
//! run through its target's checks first. Old `seed-*` files are replaced; other files in `corpus/`
//! (inputs added by hand, e.g. a fixed crash) are left alone.

use std::path::Path;

fn main() -> std::io::Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    for target in &memarts_fuzz::TARGETS {
        let dir = root.join(target.name);
        std::fs::create_dir_all(&dir)?;
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("seed-")) {
                std::fs::remove_file(path)?;
            }
        }
        let seeds = (target.seeds)();
        for (i, seed) in seeds.iter().enumerate() {
            (target.check)(seed);
            std::fs::write(dir.join(format!("seed-{i:02}")), seed)?;
        }
        println!("{}: {} seeds", dir.display(), seeds.len());
    }
    Ok(())
}
