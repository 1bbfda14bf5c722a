//! Human byte sizes for configuration: `50GiB`, `1.5TB`, `512M`, `1048576`.

/// A text that is not a byte size; the message quotes it and shows sizes that are.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SizeError {
    #[error("unknown size unit {unit:?} in {text:?} (use e.g. 50GiB, 512MiB, 1TB)")]
    UnknownUnit { unit: String, text: String },
    #[error("{text:?} is not a size (use e.g. 50GiB, 512MiB)")]
    NotANumber { text: String },
    #[error("size {text:?} is out of range")]
    OutOfRange { text: String },
}

/// Parses a byte size. Binary suffixes (`KiB`, `MiB`, `GiB`, `TiB`, and the one-letter `K`, `M`, `G`,
/// `T`) are powers of 1024; decimal ones (`KB`, `MB`, `GB`, `TB`) powers of 1000. Case-insensitive.
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let t = text.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let unit = unit.trim().to_ascii_lowercase();
    let mult: u64 = match unit.as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => return Err(SizeError::UnknownUnit { unit, text: text.to_string() }),
    };
    let value: f64 = num.parse().map_err(|_| SizeError::NotANumber { text: text.to_string() })?;
    let bytes = value * mult as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(SizeError::OutOfRange { text: text.to_string() });
    }
    Ok(bytes as u64)
}

/// Formats a byte count with a binary suffix, e.g. `1.5 GiB`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("50GiB"), Ok(50 << 30));
        assert_eq!(parse_size("1.5 KiB"), Ok(1536));
        assert_eq!(parse_size("2TB"), Ok(2_000_000_000_000));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("1m"), Ok(1 << 20));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("5 parsecs").is_err());
        assert!(parse_size("").is_err());
        // The messages users see, word for word.
        assert_eq!(
            parse_size("5 parsecs").unwrap_err().to_string(),
            r#"unknown size unit "parsecs" in "5 parsecs" (use e.g. 50GiB, 512MiB, 1TB)"#
        );
        assert_eq!(parse_size("").unwrap_err().to_string(), r#""" is not a size (use e.g. 50GiB, 512MiB)"#);
        assert_eq!(
            parse_size("99999999999TiB").unwrap_err().to_string(),
            r#"size "99999999999TiB" is out of range"#
        );
        assert_eq!(format_size(1536), "1.5 KiB");
        assert_eq!(format_size(12), "12 B");
    }
}
