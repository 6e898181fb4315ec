//! Unit tests of the configuration.

use std::time::Duration;

use super::*;

#[test]
fn defaults_validate_and_reap_interval_is_clamped() {
    let config = Config::default().validate().expect("defaults are valid");
    assert_eq!(config.reap_interval(), Duration::from_secs(300));
    let mut short = Config::default();
    short.kernels.idle_timeout = Duration::from_secs(1);
    assert_eq!(short.reap_interval(), Duration::from_secs(30));
}

#[test]
fn bad_values_name_their_field() {
    let mut config = Config::default();
    config.kernels.max_session_kernels = 0;
    let err = config.validate().unwrap_err();
    assert_eq!(err.field, "max_session_kernels");
}

#[test]
fn one_rule_for_every_cell_timeout() {
    let config = Config::default();
    assert_eq!(
        config.cell_timeout_from_secs(1.5),
        Ok(Duration::from_millis(1500))
    );
    assert_eq!(
        config.cell_timeout_from_secs(3600.0),
        Ok(Duration::from_secs(3600))
    );
    for secs in [0.0, -1.0, 1e-12, 3600.5, 1e300, f64::NAN, f64::INFINITY] {
        let err = config.cell_timeout_from_secs(secs).unwrap_err();
        assert_eq!(err.max, Duration::from_secs(3600));
        assert_eq!(
            err.to_string(),
            format!("timeout {secs:?} is not a number of seconds in (0, 3600]")
        );
    }
    let err = config
        .check_cell_timeout(Duration::from_secs(3601))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "timeout 3601.0 is not a number of seconds in (0, 3600]"
    );
    assert!(config.check_cell_timeout(Duration::ZERO).is_err());
    let err = config.invalid_timeout("\"abc\"");
    assert_eq!(
        err.to_string(),
        "timeout \"abc\" is not a number of seconds in (0, 3600]"
    );
    let mut config = Config::default();
    config.cells.timeout = Duration::from_secs(7200);
    let err = config.validate().unwrap_err();
    assert_eq!(err.field, "cell_timeout");
}

#[test]
fn durations_and_sizes_parse() {
    assert_eq!(
        parse_duration("7d").unwrap(),
        Duration::from_secs(7 * 86400)
    );
    assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
    assert!(parse_duration("soon").is_err());
    assert!(parse_duration("-1").is_err());
    assert_eq!(parse_bytes("512m").unwrap(), 512 * 1024 * 1024);
    assert_eq!(parse_bytes("1GiB").unwrap(), 1024 * 1024 * 1024);
    assert_eq!(parse_bytes("4096").unwrap(), 4096);
    assert!(parse_bytes("lots").is_err());
}
