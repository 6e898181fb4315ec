use super::*;

fn parse(text: &str) -> Result<Tenants, TenantsError> {
    Tenants::parse(text, Path::new("t.json"))
}

#[test]
fn a_valid_file_authenticates_by_token_hash() {
    let hash = hex::encode(token_hash("secret"));
    let text = format!(
        r#"{{"tenants": [{{"name": "acme", "token_sha256": "{hash}", "max_kernels": 8,
           "tools": {{"url": "http://127.0.0.1:9000/tools", "allow": ["web_search"]}}}}]}}"#
    );
    let tenants = parse(&text).unwrap();
    let acme = tenants.authenticate("secret").unwrap();
    assert_eq!(acme.name, "acme");
    assert_eq!(acme.max_kernels, Some(8));
    assert!(acme.tools.as_ref().unwrap().allow.contains("web_search"));
    assert!(tenants.authenticate("wrong").is_none());
}

#[test]
fn a_tenant_may_name_its_image() {
    let entry = |name: &str, image: &str| {
        format!(
            r#"{{"name": "{name}", "token_sha256": "{}"{image}}}"#,
            hex::encode(token_hash(name))
        )
    };
    let text = format!(
        r#"{{"tenants": [{}, {}, {}]}}"#,
        entry("ds", r#", "image": "kernelbox/kernel-datascience:latest""#),
        entry("ds2", r#", "image": "kernelbox/kernel-datascience:latest""#),
        entry("plain", r#", "image": null"#)
    );
    let tenants = parse(&text).unwrap();
    let ds = tenants.authenticate("ds").unwrap();
    assert_eq!(
        ds.image.as_deref(),
        Some("kernelbox/kernel-datascience:latest")
    );
    assert_eq!(tenants.authenticate("plain").unwrap().image, None);
    assert_eq!(
        tenants.images().into_iter().collect::<Vec<_>>(),
        vec!["kernelbox/kernel-datascience:latest"]
    );
}

#[test]
fn a_tenant_may_name_its_runtime_and_a_bad_one_refuses_the_file() {
    let entry = |name: &str, runtime: &str| {
        format!(
            r#"{{"name": "{name}", "token_sha256": "{}"{runtime}}}"#,
            hex::encode(token_hash(name))
        )
    };
    let text = format!(
        r#"{{"tenants": [{}, {}]}}"#,
        entry("sealed", r#", "runtime": "runsc""#),
        entry("plain", "")
    );
    let tenants = parse(&text).unwrap();
    assert_eq!(
        tenants.authenticate("sealed").unwrap().runtime,
        Some(crate::config::KernelRuntime::Runsc)
    );
    assert_eq!(tenants.authenticate("plain").unwrap().runtime, None);
    assert_eq!(
        tenants.runtimes(),
        std::collections::BTreeMap::from([(
            "sealed".to_string(),
            crate::config::KernelRuntime::Runsc
        )])
    );
    for bad in [r#", "runtime": "kata""#, r#", "runtime": 1"#] {
        let text = format!(r#"{{"tenants": [{}]}}"#, entry("x", bad));
        let err = parse(&text).unwrap_err();
        assert_eq!(err.field, "tenants[0].runtime", "{err}");
    }
}

#[test]
fn reservations_must_fit_the_host_cap() {
    let entry = |name: &str, reserved: usize| {
        format!(
            r#"{{"name": "{name}", "token_sha256": "{}", "reserved": {reserved}}}"#,
            hex::encode(token_hash(name))
        )
    };
    let text = format!(r#"{{"tenants": [{}, {}]}}"#, entry("a", 2), entry("b", 3));
    let tenants = parse(&text).unwrap();
    assert_eq!(
        tenants.authenticate("b").unwrap().limits().reserved,
        Some(3)
    );
    assert!(tenants.check_reserved(5).is_ok());
    let err = tenants.check_reserved(4).unwrap_err();
    assert_eq!(err.field, "tenants[*].reserved");
    assert!(
        err.to_string().starts_with("tenants file t.json: "),
        "{err}"
    );
    assert!(err.to_string().contains("--max-kernels 4"), "{err}");
}

#[test]
fn errors_name_the_file_and_field() {
    let hash = hex::encode(token_hash("x"));
    let cases = [
        ("{", "(file)"),
        ("{}", "tenants"),
        (r#"{"tenants": []}"#, "tenants"),
        (r#"{"tenants": [{"name": "a"}]}"#, "tenants[0].token_sha256"),
        (
            r#"{"tenants": [{"name": "a", "token_sha256": "zz"}]}"#,
            "tenants[0].token_sha256",
        ),
        (
            &format!(r#"{{"tenants": [{{"name": "a b", "token_sha256": "{hash}"}}]}}"#),
            "tenants[0].name",
        ),
        (
            &format!(
                r#"{{"tenants": [{{"name": "a", "token_sha256": "{hash}", "max_kernels": 0}}]}}"#
            ),
            "tenants[0].max_kernels",
        ),
        (
            &format!(
                r#"{{"tenants": [{{"name": "a", "token_sha256": "{hash}", "tools": {{"url": "ftp://x", "allow": []}}}}]}}"#
            ),
            "tenants[0].tools.url",
        ),
        (
            &format!(
                r#"{{"tenants": [{{"name": "a", "token_sha256": "{hash}", "tools": {{"url": "http://x/t", "allow": ["rm -rf"]}}}}]}}"#
            ),
            "tenants[0].tools.allow[0]",
        ),
        (
            &format!(r#"{{"tenants": [{{"name": "a", "token_sha256": "{hash}", "extra": 1}}]}}"#),
            "tenants[0].extra",
        ),
        (
            &format!(
                r#"{{"tenants": [{{"name": "a", "token_sha256": "{hash}", "reserved": -1}}]}}"#
            ),
            "tenants[0].reserved",
        ),
        (
            &format!(
                r#"{{"tenants": [{{"name": "a", "token_sha256": "{hash}", "max_kernels": 2, "reserved": 3}}]}}"#
            ),
            "tenants[0].reserved",
        ),
        (
            &format!(
                r#"{{"tenants": [{{"name": "a", "token_sha256": "{hash}"}}, {{"name": "b", "token_sha256": "{hash}"}}]}}"#
            ),
            "tenants[1].token_sha256",
        ),
        (
            &format!(
                r#"{{"tenants": [{{"name": "a", "token_sha256": "{hash}"}}, {{"name": "a", "token_sha256": "{}"}}]}}"#,
                "0".repeat(64)
            ),
            "tenants[1].name",
        ),
        (
            &format!(r#"{{"tenants": [{{"name": "a", "token_sha256": "{hash}", "image": 7}}]}}"#),
            "tenants[0].image",
        ),
        (
            &format!(r#"{{"tenants": [{{"name": "a", "token_sha256": "{hash}", "image": ""}}]}}"#),
            "tenants[0].image",
        ),
        (
            &format!(
                r#"{{"tenants": [{{"name": "a", "token_sha256": "{hash}", "image": "img --privileged"}}]}}"#
            ),
            "tenants[0].image",
        ),
    ];
    for (text, field) in cases {
        let err = parse(text).unwrap_err();
        assert_eq!(err.field, field, "{text}: {err}");
        assert!(
            err.to_string().starts_with("tenants file t.json: "),
            "{err}"
        );
    }
}

#[test]
fn a_tenants_network_is_parsed_at_load_and_a_bad_one_refuses_the_file() {
    let entry = |name: &str, network: &str| {
        format!(
            r#"{{"name": "{name}", "token_sha256": "{}"{network}}}"#,
            hex::encode(token_hash(name))
        )
    };
    let text = format!(
        r#"{{"tenants": [{}, {}, {}]}}"#,
        entry(
            "net",
            r#", "network": {"allow": ["pypi", "*.example.com:443"], "deny": ["10.0.0.0/8"]}"#
        ),
        entry("none", r#", "network": {"allow": []}"#),
        entry("plain", "")
    );
    let tenants = parse(&text).unwrap();
    let networks = tenants.networks();
    assert_eq!(networks.len(), 1, "{networks:?}");
    assert_eq!(networks["net"].allow, ["pypi", "*.example.com:443"]);
    assert_eq!(networks["net"].deny, ["10.0.0.0/8"]);
    assert!(tenants.authenticate("plain").unwrap().network.is_none());

    for (network, says) in [
        (
            r#", "network": {"allow": ["not a host"]}"#,
            "network policy entry",
        ),
        (r#", "network": {"allow": ["x:0"]}"#, "the port must be"),
        (r#", "network": {"allow": "pypi"}"#, "must be {\"allow\""),
        (
            r#", "network": {"allow": [], "block": []}"#,
            "unknown field",
        ),
    ] {
        let text = format!(r#"{{"tenants": [{}]}}"#, entry("bad", network));
        let err = parse(&text).unwrap_err();
        assert_eq!(err.field, "tenants[0].network", "{err}");
        assert!(err.to_string().contains(says), "{network}: {err}");
    }
}

#[test]
fn a_tenants_audit_is_parsed_and_a_bad_one_refuses_the_file() {
    let entry = |name: &str, audit: &str| {
        format!(
            r#"{{"name": "{name}", "token_sha256": "{}"{audit}}}"#,
            hex::encode(token_hash(name))
        )
    };
    let text = format!(
        r#"{{"tenants": [{}, {}, {}, {}]}}"#,
        entry("hashes", r#", "audit": true"#),
        entry("code", r#", "audit": {"code": true}"#),
        entry("off", r#", "audit": false"#),
        entry("plain", "")
    );
    let audits = parse(&text).unwrap().audits();
    assert_eq!(audits.len(), 2, "{audits:?}");
    assert!(!audits["hashes"].code);
    assert!(audits["code"].code);
    for (audit, field, says) in [
        (r#", "audit": "yes""#, "tenants[0].audit", "must be true"),
        (
            r#", "audit": {"output": true}"#,
            "tenants[0].audit.output",
            "unknown field",
        ),
        (
            r#", "audit": {"code": 1}"#,
            "tenants[0].audit.code",
            "true or false",
        ),
    ] {
        let text = format!(r#"{{"tenants": [{}]}}"#, entry("bad", audit));
        let err = parse(&text).unwrap_err();
        assert_eq!(err.field, field, "{err}");
        assert!(err.to_string().contains(says), "{audit}: {err}");
    }
}

#[test]
fn config_file_tenants_go_through_the_same_checks_and_name_the_config_file() {
    use crate::config::file::{NetworkEntry, Secret, TenantEntry};
    let file = Path::new("kernelbox.toml");
    let entry = |name: &str, token: &str| TenantEntry {
        name: Some(name.into()),
        token: Some(Secret::Inline(token.into())),
        ..TenantEntry::default()
    };
    let tenants = Tenants::from_entries(&[entry("a", "tok-a"), entry("b", "tok-b")], file)
        .expect("valid tenants");
    assert_eq!(tenants.authenticate("tok-b").expect("b").name, "b");
    assert!(tenants.authenticate("tok-c").is_none());

    let mut bad = entry("a", "tok-a");
    bad.network = Some(NetworkEntry {
        allow: vec!["not a host!".into()],
        deny: vec![],
    });
    let e = Tenants::from_entries(&[bad], file).unwrap_err();
    assert_eq!(
        (e.file.as_path(), e.field.as_str()),
        (file, "tenants[0].network")
    );

    let mut both = entry("a", "tok-a");
    both.token_sha256 = Some("00".repeat(32));
    let e = Tenants::from_entries(&[both], file).unwrap_err();
    assert_eq!(e.field, "tenants[0].token");

    let unset = TenantEntry {
        name: Some("a".into()),
        token: Some(Secret::env("KERNELBOX_TEST_SURELY_UNSET_TOKEN")),
        ..TenantEntry::default()
    };
    let e = Tenants::from_entries(&[unset], file).unwrap_err();
    assert!(
        e.reason.contains("KERNELBOX_TEST_SURELY_UNSET_TOKEN"),
        "{e}"
    );
    assert!(!e.to_string().contains("tok-a"));
}
