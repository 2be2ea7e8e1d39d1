//! The CUDA backend. It compiles everywhere; until GPU trials land it refuses clearly instead of
//! panicking, naming the backends that work.

use super::BackendError;

pub fn unavailable() -> BackendError {
    BackendError::Environment(
        "the cuda backend is not available in this build yet; use --backend cpu (real training steps under a \
         RAM limit) or --backend sim (a simulated memory curve)"
            .into(),
    )
}
