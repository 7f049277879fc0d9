#![no_main]
//! Any bytes → one call of an mpo-core estimator, checked (see mpo_fuzz::estimators).

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(f) = mpo_fuzz::estimators::check(data, true) {
        panic!("{f}");
    }
});
