//! Several identical devices as one that runs a round of trials at once: the GPUs of a node that
//! match (same model, same total and free memory), or `--parallel N` copies of the cpu (or sim)
//! device. Each trial of a round runs on its own device, in its own thread, as its own process under
//! its own limit; the search ([`crate::search`]) applies their outcomes one by one, as it applies a
//! single trial's. A single trial (a proof's re-run, a confirmation) runs on the first device.

use super::{run_one, Backend, BackendError, DeviceInfo, LimitMechanism, RoundTrial};
use crate::protocol::{Isolation, TrialDetails, TrialOutcome, TrialRequest};

/// One device of the set, and the GPU it is (recorded in every trial it runs).
pub struct Lane<'a> {
    pub backend: &'a mut (dyn Backend + Send),
    pub gpu: Option<u32>,
}

/// Identical devices running one trial each per round.
pub struct Lanes<'a> {
    lanes: Vec<Lane<'a>>,
    /// Exploration runs one size at a time ([`Backend::explore_width`]).
    explore_alone: bool,
}

impl<'a> Lanes<'a> {
    /// `lanes` must not be empty; the first runs the single trials.
    pub fn new(lanes: Vec<Lane<'a>>) -> Self {
        assert!(!lanes.is_empty(), "a set of devices holds at least one");
        Lanes {
            lanes,
            explore_alone: false,
        }
    }
    /// Devices that share the cores running their trials (`--parallel auto` on the cpu): only the
    /// proof's trials run side by side, exploration one size at a time.
    pub fn exploring_alone(mut self) -> Self {
        self.explore_alone = true;
        self
    }
    fn first(&self) -> &(dyn Backend + Send) {
        &*self.lanes[0].backend
    }
}

impl Backend for Lanes<'_> {
    fn device(&self) -> &DeviceInfo {
        self.first().device()
    }
    fn default_budget(&self) -> u64 {
        self.first().default_budget()
    }
    fn set_limit(&mut self, limit_bytes: u64) {
        for l in &mut self.lanes {
            l.backend.set_limit(limit_bytes);
        }
    }
    fn run_trial(&mut self, req: TrialRequest) -> Result<TrialOutcome, BackendError> {
        self.lanes[0].backend.run_trial(req)
    }
    fn isolation(&self, req: &TrialRequest) -> Isolation {
        self.first().isolation(req)
    }
    fn limit_mechanism(&self) -> LimitMechanism {
        self.first().limit_mechanism()
    }
    fn take_details(&mut self) -> Option<TrialDetails> {
        self.lanes[0].backend.take_details()
    }
    fn width(&self) -> usize {
        self.lanes.len()
    }
    fn explore_width(&self) -> usize {
        if self.explore_alone {
            1
        } else {
            self.width()
        }
    }
    fn run_round(&mut self, reqs: &[TrialRequest]) -> Vec<RoundTrial> {
        assert!(
            reqs.len() <= self.lanes.len(),
            "a round has one trial per device"
        );
        std::thread::scope(|s| {
            let handles: Vec<_> = self
                .lanes
                .iter_mut()
                .zip(reqs)
                .map(|(lane, &req)| s.spawn(move || run_one(&mut *lane.backend, req, lane.gpu)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a trial's thread panicked"))
                .collect()
        })
    }
}
