//! The simulated device: a deterministic memory curve instead of a device.
//!
//! It makes the search testable without hardware (unit tests, property tests, the search-cost benchmark,
//! and integration tests of the real binary via `--backend sim`), the way hyperfine's mock executor does.
//!
//! Spec (`--sim`), comma-separated `key=value`, the first three required:
//! * `base=SIZE`        fixed footprint (weights, optimizer state, runtime);
//! * `per-sample=SIZE`  bytes per sample in the batch;
//! * `capacity=SIZE`    the device size (the default budget);
//! * `knee=N`           below N samples the footprint stays at its value for N (allocator granularity);
//! * `jump=N:SIZE`      from N samples on, SIZE more (an algorithm switch); may repeat;
//! * `dip=N:SIZE`       from N samples on, SIZE less (a non-monotonic curve, e.g. a kernel that needs
//!   less workspace at larger sizes); may repeat;
//! * `late=SIZE`        extra bytes per sample that appear only in trials of more than 3 steps;
//! * `noise=F`          the *reported* peak varies by up to ±F (fraction, < 0.5) of itself, deterministically
//!   per (batch, steps, seed); the fit decision uses the true value;
//! * `seed=N`           seed for the noise;
//! * `boundary-noise=SIZE` the *true* footprint of each trial moves by a uniform draw in ±SIZE, drawn
//!   afresh for every trial (from the seed, the batch, the steps and the trial's number), so a size
//!   near the limit fits in some trials and not in others, as a real job's peak does from one fresh
//!   run to the next (a noisy boundary: docs/how-it-works.md, "A noisy boundary");
//! * `fail-at=N`        trials at exactly N samples end in `error` (to exercise error handling);
//! * `retries=N`        fitting trials at N samples or more complete only with caching-allocator retries
//!   (outcome `retries`, as a CUDA trial near the limit; see `--allow-retries`);
//! * `accumulation=SIZE` trials that accumulate gradients over more than one micro-batch hold SIZE
//!   more (the gradients kept between micro-batches), as a real trainer does.
//!
//! peak(b) = base + per-sample × max(b, knee) + Σ jumps with N ≤ b (+ late × b when steps > 3).
//! Step time is modeled as 1 ms + 1 µs × b.

use super::{Backend, BackendError, DeviceInfo, DeviceKind, LimitMechanism};
use crate::platform::units::{format_size, parse_size};
use crate::protocol::{Isolation, TrialOutcome, TrialRequest};
use serde::{Deserialize, Serialize};
use thiserror::Error;

#[derive(Debug, Error, PartialEq)]
#[error("invalid --sim spec {spec:?}: {reason} (expected e.g. base=500MiB,per-sample=2MiB,capacity=8GiB)")]
pub struct SimSpecError {
    pub spec: String,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimSpec {
    pub base: u64,
    pub per_sample: u64,
    pub capacity: u64,
    #[serde(default)]
    pub knee: u64,
    #[serde(default)]
    pub jumps: Vec<(u64, u64)>,
    #[serde(default)]
    pub dips: Vec<(u64, u64)>,
    #[serde(default)]
    pub late_per_sample: u64,
    #[serde(default)]
    pub noise: f64,
    #[serde(default)]
    pub seed: u64,
    /// Run-to-run noise of the true footprint, in bytes (`boundary-noise=SIZE`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub boundary_noise: u64,
    #[serde(default)]
    pub fail_at: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retries_from: Option<u64>,
    /// Extra bytes of a trial with gradient accumulation (`accumulation=SIZE`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub accumulation_extra: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

impl SimSpec {
    pub fn affine(base: u64, per_sample: u64, capacity: u64) -> Self {
        SimSpec {
            base,
            per_sample,
            capacity,
            knee: 0,
            jumps: vec![],
            dips: vec![],
            late_per_sample: 0,
            noise: 0.0,
            seed: 0,
            boundary_noise: 0,
            fail_at: None,
            retries_from: None,
            accumulation_extra: 0,
        }
    }

    pub fn parse(spec: &str) -> Result<Self, SimSpecError> {
        let err = |reason: String| SimSpecError {
            spec: spec.to_string(),
            reason,
        };
        let (mut base, mut per, mut cap) = (None, None, None);
        let mut s = SimSpec::affine(0, 0, 0);
        for part in spec.split(',') {
            let part = part.trim();
            if part.is_empty() {
                return Err(err("empty item".into()));
            }
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| err(format!("{part:?} is not key=value")))?;
            let size = |v: &str| parse_size(v).map_err(|e| err(e.to_string()));
            let count = |v: &str| {
                v.trim()
                    .parse::<u64>()
                    .map_err(|_| err(format!("{k}: {v:?} is not a whole number")))
            };
            let once = |slot: &Option<u64>| {
                if slot.is_some() {
                    Err(err(format!("{k} given twice")))
                } else {
                    Ok(())
                }
            };
            match k.trim() {
                "base" => {
                    once(&base)?;
                    base = Some(size(v)?)
                }
                "per-sample" => {
                    once(&per)?;
                    per = Some(size(v)?)
                }
                "capacity" => {
                    once(&cap)?;
                    cap = Some(size(v)?)
                }
                "knee" => s.knee = count(v)?,
                "jump" => {
                    let (n, sz) = v
                        .split_once(':')
                        .ok_or_else(|| err(format!("jump={v:?}: expected N:SIZE")))?;
                    s.jumps.push((count(n)?, size(sz)?));
                }
                "dip" => {
                    let (n, sz) = v
                        .split_once(':')
                        .ok_or_else(|| err(format!("dip={v:?}: expected N:SIZE")))?;
                    s.dips.push((count(n)?, size(sz)?));
                }
                "late" => s.late_per_sample = size(v)?,
                "noise" => {
                    let f: f64 = v
                        .trim()
                        .parse()
                        .map_err(|_| err(format!("noise={v:?} is not a number")))?;
                    if !(0.0..0.5).contains(&f) {
                        return Err(err(format!("noise={v} must be in [0, 0.5)")));
                    }
                    s.noise = f;
                }
                "seed" => s.seed = count(v)?,
                "boundary-noise" => s.boundary_noise = size(v)?,
                "fail-at" => s.fail_at = Some(count(v)?),
                "retries" => s.retries_from = Some(count(v)?),
                "accumulation" => s.accumulation_extra = size(v)?,
                other => return Err(err(format!("unknown key {other:?}"))),
            }
        }
        s.base = base.ok_or_else(|| err("base= is required".into()))?;
        s.per_sample = per.ok_or_else(|| err("per-sample= is required".into()))?;
        s.capacity = cap.ok_or_else(|| err("capacity= is required".into()))?;
        if s.per_sample == 0 {
            return Err(err("per-sample must be > 0".into()));
        }
        if s.capacity == 0 {
            return Err(err("capacity must be > 0".into()));
        }
        Ok(s)
    }

    /// The true footprint of a trial.
    pub fn peak(&self, batch: u64, steps: u32) -> u64 {
        let b = batch.max(self.knee);
        let mut p = self.base.saturating_add(self.per_sample.saturating_mul(b));
        for &(n, sz) in &self.jumps {
            if batch >= n {
                p = p.saturating_add(sz);
            }
        }
        for &(n, sz) in &self.dips {
            if batch >= n {
                p = p.saturating_sub(sz);
            }
        }
        if steps > 3 {
            p = p.saturating_add(self.late_per_sample.saturating_mul(batch));
        }
        p
    }

    /// The true footprint of a trial of `accumulation` micro-batches per step.
    pub fn peak_at(&self, batch: u64, steps: u32, accumulation: u32) -> u64 {
        let p = self.peak(batch, steps);
        if accumulation > 1 {
            p.saturating_add(self.accumulation_extra)
        } else {
            p
        }
    }

    /// The peak as reported, with deterministic measurement noise.
    pub fn reported_peak(&self, batch: u64, steps: u32) -> u64 {
        let p = self.peak(batch, steps);
        if self.noise == 0.0 {
            return p;
        }
        let u = uniform(
            self.seed
                .wrapping_add(batch.wrapping_mul(0x9E37_79B9_7F4A_7C15))
                .wrapping_add(steps as u64),
        );
        (p as f64 * (1.0 + self.noise * u)).max(0.0) as u64
    }

    /// The signed move of trial number `n`'s footprint (`boundary-noise`): uniform in ±SIZE.
    pub fn boundary_offset(&self, batch: u64, steps: u32, n: u64) -> i64 {
        if self.boundary_noise == 0 {
            return 0;
        }
        let key = self
            .seed
            .wrapping_mul(0xD1B5_4A32_D192_ED03)
            .wrapping_add(batch.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .wrapping_add((steps as u64) << 32)
            .wrapping_add(n.wrapping_mul(0xA24B_AED4_963E_E407));
        (uniform(key) * self.boundary_noise.min(i64::MAX as u64) as f64) as i64
    }

    /// Largest batch in [1, cap] whose true peak (at `steps`) is ≤ limit, by scanning; 0 if none.
    /// Used by tests and benchmarks as ground truth (the curve is monotonic in the batch).
    pub fn true_max(&self, limit: u64, steps: u32, cap: u64) -> u64 {
        let (mut lo, mut hi) = (0u64, cap + 1); // peak(lo) fits (or lo = 0), peak(hi) does not (or hi = cap+1)
        if self.peak(1, steps) > limit {
            return 0;
        }
        lo = lo.max(1);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if self.peak(mid, steps) <= limit {
                lo = mid
            } else {
                hi = mid
            }
        }
        lo
    }

    pub fn describe(&self) -> String {
        format!(
            "sim(base={}, per-sample={}, capacity={})",
            format_size(self.base),
            format_size(self.per_sample),
            format_size(self.capacity)
        )
    }
}

/// splitmix64 of `key`, as a uniform draw in [-1, 1).
fn uniform(key: u64) -> f64 {
    let mut z = key;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
}

/// The simulated device.
pub struct SimBackend {
    spec: SimSpec,
    limit: u64,
    device: DeviceInfo,
    /// How many trials ran (for tests).
    pub trials_run: u64,
}

impl SimBackend {
    pub fn new(spec: SimSpec) -> Self {
        let device = DeviceInfo {
            kind: DeviceKind::Sim,
            name: spec.describe(),
            total_bytes: spec.capacity,
            free_bytes_at_start: spec.capacity,
        };
        SimBackend {
            limit: spec.capacity,
            spec,
            device,
            trials_run: 0,
        }
    }
    pub fn spec(&self) -> &SimSpec {
        &self.spec
    }
}

impl Backend for SimBackend {
    fn device(&self) -> &DeviceInfo {
        &self.device
    }
    fn default_budget(&self) -> u64 {
        self.spec.capacity
    }
    fn set_limit(&mut self, limit_bytes: u64) {
        self.limit = limit_bytes;
    }
    fn isolation(&self, _req: &TrialRequest) -> Isolation {
        Isolation::None
    }
    fn limit_mechanism(&self) -> LimitMechanism {
        LimitMechanism::Simulated
    }
    fn run_trial(&mut self, req: TrialRequest) -> Result<TrialOutcome, BackendError> {
        self.trials_run += 1;
        if self.spec.fail_at == Some(req.batch) {
            return Ok(TrialOutcome::Error {
                message: format!("simulated failure at batch {}", req.batch),
            });
        }
        let offset = self
            .spec
            .boundary_offset(req.batch, req.steps, self.trials_run);
        let moved = |p: u64| p.saturating_add_signed(offset);
        let peak = moved(self.spec.peak_at(req.batch, req.steps, req.accumulation));
        let reported = moved(
            self.spec.reported_peak(req.batch, req.steps)
                + (self.spec.peak_at(req.batch, req.steps, req.accumulation)
                    - self.spec.peak(req.batch, req.steps)),
        );
        let step_seconds = 1e-3 + 1e-6 * req.batch as f64;
        Ok(
            if peak <= self.limit && self.spec.retries_from.is_some_and(|r| req.batch >= r) {
                TrialOutcome::Retries {
                    retries: 1,
                    peak_bytes: reported,
                    step_seconds,
                    gpu: None,
                }
            } else if peak <= self.limit {
                TrialOutcome::Fits {
                    peak_bytes: reported,
                    rss_peak_bytes: None,
                    step_seconds,
                    gpu: None,
                }
            } else {
                TrialOutcome::Oom {
                    message: format!(
                        "simulated out of memory: tried to use {} of a {} limit",
                        format_size(peak),
                        format_size(self.limit)
                    ),
                    peak_bytes: None,
                    rss_peak_bytes: None,
                    gpu: None,
                }
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_full_spec() {
        let s = SimSpec::parse("base=1GiB,per-sample=1MiB,capacity=8GiB,knee=16,jump=100:64MiB,late=1KiB,noise=0.02,seed=7")
            .unwrap();
        assert_eq!(s.base, 1 << 30);
        assert_eq!(s.jumps, vec![(100, 64 << 20)]);
        assert_eq!(s.peak(1, 3), (1 << 30) + 16 * (1 << 20));
        assert_eq!(s.peak(100, 3), (1 << 30) + 100 * (1 << 20) + (64 << 20));
        assert_eq!(s.peak(100, 5), s.peak(100, 3) + 100 * 1024);
    }

    #[test]
    fn rejects_bad_specs() {
        for bad in [
            "",
            "base=1GiB,per-sample=1MiB",
            "base=1GiB,per-sample=0,capacity=1GiB",
            "base=1GiB,per-sample=1MiB,capacity=1GiB,wat=3",
            "base=1GiB,base=2GiB,per-sample=1MiB,capacity=1GiB",
            "base=x,per-sample=1MiB,capacity=1GiB",
            "base=1GiB,per-sample=1MiB,capacity=1GiB,noise=0.7",
            "base=1GiB,per-sample=1MiB,capacity=1GiB,jump=5",
            "base=1GiB,per-sample=1MiB,capacity=1GiB,",
        ] {
            assert!(SimSpec::parse(bad).is_err(), "{bad:?}");
        }
    }

    proptest! {
        #[test]
        fn parser_never_panics(s in "[a-z=,:0-9.GMiB-]{0,40}") {
            let _ = SimSpec::parse(&s);
        }

        #[test]
        fn true_max_is_the_crossing(base in 0u64..1<<30, per in 1u64..1<<20, limit in 0u64..1<<32) {
            let s = SimSpec::affine(base, per, limit);
            let m = s.true_max(limit, 3, 1_000_000);
            if m > 0 { prop_assert!(s.peak(m, 3) <= limit); }
            if m < 1_000_000 { prop_assert!(s.peak(m + 1, 3) > limit); }
        }
    }
}
