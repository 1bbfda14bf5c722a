//! One row per fault class, the table `make reliability` prints, and its JSON.

use std::fmt::Write as _;

/// What one campaign did and what came of it. `failed_calls` counts client calls that failed where
/// the promise is success; `expected_errors` counts the typed errors a promise calls for (a miss
/// while the origin is down, a read that met a replaced object, a write cut by `kill -9`).
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Row {
    pub class: String,
    pub fault: String,
    pub injected: u64,
    pub detected: u64,
    pub bytes_verified: u64,
    pub wrong_bytes: u64,
    pub acked_lost: u64,
    pub partial_visible: u64,
    pub failed_calls: u64,
    pub expected_errors: u64,
    pub seconds: f64,
    /// What "detected" counts for this fault, and anything else worth knowing.
    pub note: String,
    /// A promise this row breaks, if any: the run fails.
    pub violations: Vec<String>,
}

impl Row {
    pub fn new(class: &str, fault: &str) -> Row {
        Row { class: class.into(), fault: fault.into(), ..Row::default() }
    }

    pub fn violate(&mut self, what: impl Into<String>) {
        self.violations.push(what.into());
    }

    /// The promises every row keeps: no wrong byte, no acknowledged object lost, no partial object.
    pub fn check_integrity(&mut self) {
        if self.wrong_bytes > 0 {
            self.violate(format!("{} wrong bytes served", self.wrong_bytes));
        }
        if self.acked_lost > 0 {
            self.violate(format!("{} acknowledged objects lost", self.acked_lost));
        }
        if self.partial_visible > 0 {
            self.violate(format!("{} partial objects visible", self.partial_visible));
        }
    }
}

pub fn table(rows: &[Row]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| class | fault | injected | detected | wrong bytes / bytes verified | acked objects lost | failed calls | expected typed errors | s |"
    );
    let _ = writeln!(out, "|---|---|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} / {} | {} | {} | {} | {:.1} |",
            r.class,
            r.fault,
            r.injected,
            r.detected,
            r.wrong_bytes,
            human(r.bytes_verified),
            r.acked_lost,
            r.failed_calls,
            r.expected_errors,
            r.seconds
        );
    }
    let total = |f: fn(&Row) -> u64| rows.iter().map(f).sum::<u64>();
    let _ = writeln!(
        out,
        "| **all** | | {} | {} | {} / {} | {} | {} | {} | {:.1} |",
        total(|r| r.injected),
        total(|r| r.detected),
        total(|r| r.wrong_bytes),
        human(total(|r| r.bytes_verified)),
        total(|r| r.acked_lost),
        total(|r| r.failed_calls),
        total(|r| r.expected_errors),
        rows.iter().map(|r| r.seconds).sum::<f64>()
    );
    out
}

pub fn notes(rows: &[Row]) -> String {
    let mut out = String::new();
    for r in rows.iter().filter(|r| !r.note.is_empty()) {
        let _ = writeln!(out, "- **{} / {}**: {}", r.class, r.fault, r.note);
    }
    out
}

fn human(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}
