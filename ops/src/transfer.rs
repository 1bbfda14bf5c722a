//! `memarts ls` and `memarts cp`: listing and downloading, through the fleet when one runs.
//! Progress (bytes, rate, ETA) is drawn on stderr when it is a terminal, and nothing otherwise.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use memarts_protocol::ObjectMeta;
use memarts_shim::local_file::write_atomically;

use memarts_session::{Mode, Session};

use crate::access::{access, AboutUrl};
use crate::cli::{Common, CpArgs, LsArgs, PutArgs};

/// Bytes read per step of one copy.
const WINDOW: usize = 8 << 20;

fn is_remote(url: &str) -> bool {
    url.contains("://") && !url.starts_with("file://")
}

pub fn ls(common: &Common, args: &LsArgs) -> Result<ExitCode> {
    let entries = access(common)?.list(&args.url, args.recursive).about(&args.url)?;
    let mut out = std::io::stdout().lock();
    for e in entries {
        let line = if args.long {
            let kind = if e.is_dir { "DIR" } else { "" };
            format!("{:>12} {:>3} {}", if e.is_dir { String::new() } else { e.size.to_string() }, kind, e.url)
        } else {
            e.url
        };
        if writeln!(out, "{line}").is_err() {
            break; // a closed pipe (`| head`) is not an error
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn progress(total: u64, files: usize) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    let style = ProgressStyle::with_template(
        "{spinner} {bytes}/{total_bytes} {bytes_per_sec} ETA {eta} [{wide_bar}] {msg}",
    )
    .unwrap_or_else(|_| ProgressStyle::default_bar());
    bar.set_style(style);
    bar.set_message(format!("{files} files"));
    bar
}

pub fn cp(common: &Common, args: &CpArgs) -> Result<ExitCode> {
    if is_remote(&args.dst) {
        return upload(common, args);
    }
    let dst = PathBuf::from(args.dst.trim_start_matches("file://"));
    let access = access(common)?;
    let jobs: Vec<(String, PathBuf, u64)> = if args.recursive {
        let base = args.src.trim_end_matches('/');
        let listed = access.list(base, true).about(&args.src)?;
        let canonical = memarts_shim::absolutize(base)?;
        let canonical = canonical.replacen("obs://", "s3://", 1).replacen("oss://", "s3://", 1);
        listed
            .into_iter()
            .filter(|e| !e.is_dir)
            .map(|e| {
                let rel = e.url.strip_prefix(&format!("{canonical}/")).unwrap_or(&e.url).to_string();
                (e.url.clone(), dst.join(rel), e.size)
            })
            .collect()
    } else {
        let meta = access.stat(&args.src).about(&args.src)?;
        let target = if dst.is_dir() {
            dst.join(args.src.trim_end_matches('/').rsplit('/').next().unwrap_or("object"))
        } else {
            dst.clone()
        };
        vec![(args.src.clone(), target, meta.size)]
    };
    let bar = progress(jobs.iter().map(|j| j.2).sum(), jobs.len());
    let failures = run_jobs(threads(args)?, &jobs, |(src, dst, _)| {
        copy_one(&access, src, dst, &bar).with_context(|| src.clone())
    });
    bar.finish_and_clear();
    report(failures, jobs.len())
}

pub fn put(common: &Common, args: &PutArgs) -> Result<ExitCode> {
    let access = access(common)?;
    let size = if args.memarts_only {
        if access.mode() != Mode::Proxy {
            bail!(
                "--memarts-only needs a running fleet (memarts start_proxy N): the cache holds the only copy"
            );
        }
        let data = std::fs::read(&args.file).with_context(|| args.file.display().to_string())?;
        access.put_memarts_bytes(&args.url, &data)?.size
    } else {
        access.put_file(&args.url, &args.file)?.size
    };
    eprintln!(
        "memarts: stored {} ({size} bytes{})",
        args.url,
        if args.memarts_only { ", memarts-only" } else { "" }
    );
    Ok(ExitCode::SUCCESS)
}

/// `cp LOCAL URL` (one file) or `cp -r LOCAL_DIR URL_PREFIX` (every file below it).
fn upload(common: &Common, args: &CpArgs) -> Result<ExitCode> {
    if is_remote(&args.src) {
        bail!(
            "cp from {} to {}: copy object to object through a local file, or use memarts.file.copy",
            args.src,
            args.dst
        );
    }
    let src = PathBuf::from(args.src.trim_start_matches("file://"));
    let dst = args.dst.trim_end_matches('/');
    let jobs: Vec<(PathBuf, String, u64)> = if args.recursive {
        let mut out = Vec::new();
        let mut stack = vec![src.clone()];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).with_context(|| dir.display().to_string())? {
                let entry = entry?;
                let path = entry.path();
                if entry.file_type()?.is_dir() {
                    stack.push(path);
                } else {
                    let rel = path.strip_prefix(&src).unwrap_or(&path).to_string_lossy().into_owned();
                    out.push((path.clone(), format!("{dst}/{rel}"), entry.metadata()?.len()));
                }
            }
        }
        out
    } else {
        let len = std::fs::metadata(&src).with_context(|| src.display().to_string())?.len();
        vec![(src.clone(), dst.to_string(), len)]
    };
    let access = access(common)?;
    let bar = progress(jobs.iter().map(|j| j.2).sum(), jobs.len());
    let failures = run_jobs(threads(args)?, &jobs, |(src, dst, len)| {
        access.put_file(dst, src).map(|_| bar.inc(*len)).with_context(|| src.display().to_string())
    });
    bar.finish_and_clear();
    report(failures, jobs.len())
}

/// Objects copied at once: `--threads`, else `MOX_COPY_PARALLEL_THREADS`, else 16.
fn threads(args: &CpArgs) -> Result<usize> {
    Ok(match args.threads {
        Some(n) => n,
        None => memarts_settings::Settings::from_env()?.parallel,
    })
}

/// Runs `job` over every element of `jobs` on up to `threads` threads; returns the failures.
fn run_jobs<T: Sync>(
    threads: usize,
    jobs: &[T],
    job: impl Fn(&T) -> Result<()> + Sync,
) -> Vec<anyhow::Error> {
    let next = AtomicUsize::new(0);
    let failures = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..threads.clamp(1, 256).min(jobs.len().max(1)) {
            s.spawn(|| loop {
                let Some(item) = jobs.get(next.fetch_add(1, Ordering::Relaxed)) else { return };
                if let Err(e) = job(item) {
                    failures.lock().unwrap_or_else(|p| p.into_inner()).push(e);
                }
            });
        }
    });
    failures.into_inner().unwrap_or_else(|p| p.into_inner())
}

fn report(failures: Vec<anyhow::Error>, total: usize) -> Result<ExitCode> {
    if !failures.is_empty() {
        for f in failures.iter().take(10) {
            eprintln!("memarts: cp: {f:#}");
        }
        bail!("{} of {total} files could not be copied", failures.len());
    }
    Ok(ExitCode::SUCCESS)
}

/// One object (or local file) to `dst`, via a temp file renamed into place.
fn copy_one(access: &Session, src: &str, dst: &Path, bar: &ProgressBar) -> Result<()> {
    if let Some(parent) = dst.parent() {
        std::fs::create_dir_all(parent).with_context(|| parent.display().to_string())?;
    }
    write_atomically(dst, |tmp| -> Result<()> {
        let mut out = std::fs::File::create(tmp).with_context(|| tmp.display().to_string())?;
        let meta: ObjectMeta = access.stat(src)?;
        let mut buf = vec![0u8; WINDOW.min(meta.size as usize).max(1)];
        let mut offset = 0;
        while offset < meta.size {
            let n = access.read_at(src, &meta, offset, &mut buf[..])?;
            if n == 0 {
                bail!("object ended at {offset} of {} bytes", meta.size);
            }
            out.write_all(&buf[..n])?;
            offset += n as u64;
            bar.inc(n as u64);
        }
        out.sync_data()?;
        Ok(())
    })
}
