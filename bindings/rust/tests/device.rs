//! Device collectors through the typed options, on a machine without a GPU:
//! the library's refusals come back as errors and the session goes on.
mod common;

use std::time::Duration;

use candle_trace::*;
use common::*;

#[test]
fn options_serialize_to_the_headers_keys() {
    assert_eq!(DeviceOptions::new().to_json(), "{}");
    let o = DeviceOptions::new()
        .collect(Collector::Cupti)
        .interval(Duration::from_millis(25))
        .devices(&[1, 0])
        .cupti_lib("/opt/cupti")
        .unspanned_launches(UnspannedLaunches::MainThread);
    assert_eq!(
        o.to_json(),
        r#"{"collect":["cupti"],"interval_ms":25,"devices":[1,0],"cupti_lib":"/opt/cupti","unspanned_launches":"main_thread"}"#
    );
}

#[test]
fn unavailable_collectors_are_errors_and_the_session_goes_on() {
    let dir = fresh_dir("device");
    let path = dir.path().join("t.jsonl");
    let session = Session::open(&path, Run::training("rust::device", 1, "cuda:0")).unwrap();

    if !std::path::Path::new("/proc/driver/nvidia/version").exists() {
        // No driver here: NVML cannot start (no libnvidia-ml, or one with no driver behind it).
        let err = session
            .start_devices(&DeviceOptions::new().collect(Collector::Nvml))
            .unwrap_err();
        assert_eq!(err.status(), Some(Status::Unavailable));
        assert!(
            err.message()
                .starts_with("ct_device_start: NVML is unavailable: "),
            "{}",
            err.message()
        );
    }

    let err = session
        .start_devices(
            &DeviceOptions::new()
                .collect(Collector::Cupti)
                .cupti_lib("/nonexistent/cupti"),
        )
        .unwrap_err();
    assert_eq!(err.status(), Some(Status::Unavailable));
    assert!(
        err.message()
            .starts_with("ct_device_start: CUPTI is unavailable: no libcupti could be loaded ("),
        "{}",
        err.message()
    );

    // The library judges the values: an interval it does not take.
    let err = session
        .start_devices(&DeviceOptions::new().interval(Duration::from_secs(61)))
        .unwrap_err();
    assert_eq!(err.status(), Some(Status::InvalidArgument));
    assert_eq!(
        err.message(),
        r#"ct_device_start: options_json: "interval_ms" must be an integer from 1 to 60000, got 61000"#
    );

    session.device_stop().unwrap(); // nothing runs: nothing to stop
    {
        let _m = session.measure("update").unwrap();
    }
    session.finish().unwrap();
    assert_valid_complete(&path);
}
