//! Human byte sizes: `1.5GiB`, `800MiB`, `2G`, `4096`.
//!
//! User input, so every malformed form is an error that says what is accepted. Binary (`KiB`, `MiB`,
//! `GiB`, `TiB`, ×1024) and decimal (`KB`, `MB`, `GB`, `TB`, ×1000) suffixes are both accepted; a bare
//! `K/M/G/T` (or `Ki`, `Mi`, …) means the binary unit, as in `ulimit` and Slurm's `--mem`. Case does not
//! matter (`2g`, `2gib`, `2GiB` are the same). A bare number is bytes. Printing always uses binary
//! units. [`UNITS_HELP`] says the same in `--help`.

use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
#[error("invalid size {input:?}: {reason} (use e.g. 1.5GiB, 800MiB, 4096, 2G)")]
pub struct SizeError {
    pub input: String,
    pub reason: &'static str,
}

/// What sizes accept, for `--help` texts.
pub const UNITS_HELP: &str =
    "K, M, G, T and KiB, MiB, GiB, TiB are binary (×1024); KB, MB, GB, TB \
     are decimal (×1000); case does not matter; a bare number is bytes";

/// Whether `input` has no unit (a bare number of bytes).
pub fn is_bare_number(input: &str) -> bool {
    let s = input.trim();
    !s.is_empty() && s.chars().all(|c| c.is_ascii_digit() || c == '.')
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
    if num.is_empty() && s.starts_with('-') {
        return Err(err("a size cannot be negative"));
    }
    if num.is_empty() {
        return Err(err("no number"));
    }
    if num.matches('.').count() > 1 || num.starts_with('.') || num.ends_with('.') {
        return Err(err("malformed number"));
    }
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "ki" | "kib" => 1 << 10,
        "m" | "mi" | "mib" => 1 << 20,
        "g" | "gi" | "gib" => 1 << 30,
        "t" | "ti" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
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
        // case does not matter: binary with or without "i", decimal only with "B" after the prefix
        for (a, b) in [
            ("2g", "2GiB"),
            ("2gib", "2GiB"),
            ("2GIB", "2GiB"),
            ("2Gi", "2GiB"),
            ("2gb", "2GB"),
            ("1.5m", "1.5MiB"),
            ("3tib", "3T"),
            ("4kb", "4KB"),
        ] {
            assert_eq!(parse_size(a).unwrap(), parse_size(b).unwrap(), "{a} vs {b}");
        }
        assert_eq!(parse_size("2GB").unwrap(), 2_000_000_000);
        assert_eq!(parse_size("2G").unwrap(), 2 << 30);
        assert!(is_bare_number("12") && !is_bare_number("12G") && !is_bare_number(""));
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
