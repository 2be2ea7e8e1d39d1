//! Human byte sizes: `1.5GiB`, `800MiB`, `2G`, `4096`.
//!
//! User input, so every malformed form is an error that says what is accepted. Binary (`KiB`, `MiB`,
//! `GiB`, `TiB`) and decimal (`KB`, `MB`, `GB`, `TB`) suffixes are both accepted; a bare `K/M/G/T` means
//! the binary unit, as in `ulimit` and most job schedulers. Printing always uses binary units.

use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
#[error("invalid size {input:?}: {reason} (use e.g. 1.5GiB, 800MiB, 4096, 2G)")]
pub struct SizeError {
    pub input: String,
    pub reason: &'static str,
}

/// Parses a byte size. Zero is allowed here; callers that need a positive size check it.
pub fn parse_size(input: &str) -> Result<u64, SizeError> {
    let err = |reason| SizeError {
        input: input.to_string(),
        reason,
    };
    let s = input.trim();
    if s.is_empty() {
        return Err(err("empty"));
    }
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    if num.is_empty() {
        return Err(err("no number"));
    }
    if num.matches('.').count() > 1 || num.starts_with('.') || num.ends_with('.') {
        return Err(err("malformed number"));
    }
    let mult: u64 = match unit.trim() {
        "" | "B" | "b" => 1,
        "K" | "k" | "KiB" | "kiB" | "Ki" => 1 << 10,
        "M" | "m" | "MiB" | "Mi" => 1 << 20,
        "G" | "g" | "GiB" | "Gi" => 1 << 30,
        "T" | "t" | "TiB" | "Ti" => 1 << 40,
        "KB" | "kB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        _ => return Err(err("unknown unit")),
    };
    let value: f64 = num.parse().map_err(|_| err("malformed number"))?;
    let bytes = value * mult as f64;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(err("too large"));
    }
    if mult == 1 && num.contains('.') {
        return Err(err("a byte count must be a whole number"));
    }
    Ok(bytes.round() as u64)
}

/// Formats bytes with a binary unit and two decimals, e.g. `1.50 GiB`.
pub fn format_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i < UNITS.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.2} {}", UNITS[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn accepted_forms() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("1.5GiB").unwrap(), 1536 << 20);
        assert_eq!(parse_size("800MiB").unwrap(), 800 << 20);
        assert_eq!(parse_size("2G").unwrap(), 2 << 30);
        assert_eq!(parse_size("1GB").unwrap(), 1_000_000_000);
        assert_eq!(parse_size(" 64 KiB ").unwrap(), 64 << 10);
    }

    #[test]
    fn rejected_forms() {
        for bad in [
            "", "GiB", "1.2.3G", "-1G", "1XB", "1.5", ".5G", "5.G", "1e9", "12GiBx",
        ] {
            assert!(parse_size(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    proptest! {
        #[test]
        fn never_panics(s in "\\PC{0,16}") {
            let _ = parse_size(&s);
        }

        #[test]
        fn mib_round_trip(n in 0u64..10_000_000) {
            prop_assert_eq!(parse_size(&format!("{n}MiB")).unwrap(), n << 20);
            prop_assert_eq!(parse_size(&format!("{n}")).unwrap(), n);
        }
    }
}
