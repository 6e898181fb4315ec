//! The configuration file (`docs/configuration.md`) against the real binary: `config check`
//! names the bad key and loses nothing; `serve --print-config` shows the file and the flags
//! resolved, flags over the file, secrets redacted; `config migrate` writes a file that serves
//! the same configuration as the flags it came from; and a real `serve --config` with
//! `[[tenants]]` and `[tenant_defaults]` serves its tenants against the real engine.

#![allow(clippy::unwrap_used)]

mod common;
#[path = "common/http.rs"]
mod http;

use std::path::Path;
use std::process::Output;

use http::Api;
use hyper::StatusCode;
use serde_json::json;

/// `kernelbox ARGS...` with no KERNELBOX_* variable of the environment: its output.
fn kernelbox(args: &[&str]) -> Output {
    kernelbox_with(args, &[])
}

/// [`kernelbox`] with these variables set.
fn kernelbox_with(args: &[&str], vars: &[(&str, &str)]) -> Output {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_kernelbox"));
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("KERNELBOX_") {
            cmd.env_remove(key);
        }
    }
    cmd.envs(vars.iter().copied());
    cmd.args(args).output().expect("run kernelbox")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn write(dir: &Path, name: &str, content: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, content).unwrap();
    path.display().to_string()
}

const HASH_A: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

#[test]
fn check_names_the_bad_keys_path_line_and_why_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let bad = format!(
        "[server]\nmax_kernels = 4\n\n[[tenants]]\nname = \"a\"\ntoken_sha256 = \"{HASH_A}\"\n\n[[tenants]]\nname = \"b\"\nmax_kernls = 3\n"
    );
    let file = write(dir.path(), "bad.toml", &bad);
    let out = kernelbox(&["config", "check", &file]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("tenants[1].max_kernls"), "{stderr}");
    assert!(stderr.contains("line 10, column 1"), "{stderr}");
    assert!(stderr.contains("unknown field"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        bad,
        "the file is untouched"
    );

    // A value the flag's own parser refuses names the key, not the flag.
    let file = write(dir.path(), "zero.toml", "[limits]\nmax_connections = 0\n");
    let out = kernelbox(&["config", "check", &file]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("limits.max_connections"), "{stderr}");

    // A tenant's bad field is named as the tenants file names it, in the config file.
    let file = write(
        dir.path(),
        "net.toml",
        &format!("[[tenants]]\nname = \"a\"\ntoken_sha256 = \"{HASH_A}\"\nnetwork = {{ allow = [\"not a host!\"] }}\n"),
    );
    let out = kernelbox(&["config", "check", &file]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("net.toml") && stderr.contains("tenants[0].network"),
        "{stderr}"
    );

    let good = format!(
        "[server]\nmax_kernels = 4\nidle_timeout = \"10m\"\n[tenant_defaults]\nmax_kernels = 2\n[[tenants]]\nname = \"a\"\ntoken_sha256 = \"{HASH_A}\"\n"
    );
    let file = write(dir.path(), "good.toml", &good);
    let out = kernelbox(&["config", "check", &file]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

#[test]
fn print_config_resolves_flags_over_the_file_and_never_prints_a_secret() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = write(dir.path(), "admin", "admin-token-in-a-file\n");
    let file = write(
        dir.path(),
        "k.toml",
        &format!(
            "[server]\nmax_kernels = 5\nidle_timeout = \"10m\"\n\
             [cluster]\nadmin_token = {{ file = \"{token_file}\" }}\n\
             [tenant_defaults]\nmax_kernels = 2\nsession_limits = {{ memory = \"1g\" }}\n\
             [[tenants]]\nname = \"inline\"\ntoken = \"inline-tenant-secret\"\n\
             [[tenants]]\nname = \"own\"\ntoken_sha256 = \"{HASH_A}\"\nmax_kernels = 3\n"
        ),
    );
    let out = kernelbox(&[
        "serve",
        "--config",
        &file,
        "--max-kernels",
        "9",
        "--print-config",
    ]);
    let printed = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(!printed.contains("inline-tenant-secret"), "{printed}");
    assert!(!printed.contains("admin-token-in-a-file"), "{printed}");
    assert!(printed.contains("<redacted>"), "{printed}");
    let parsed: toml::Table = toml::from_str(&printed).unwrap();
    assert_eq!(
        parsed["server"]["max_kernels"].as_integer(),
        Some(9),
        "the flag wins"
    );
    assert_eq!(
        parsed["server"]["idle_timeout"].as_str(),
        Some("10m"),
        "the file's key"
    );
    let tenants = parsed["tenants"].as_array().unwrap();
    assert_eq!(
        tenants[0]["max_kernels"].as_integer(),
        Some(2),
        "the default"
    );
    assert_eq!(
        tenants[1]["max_kernels"].as_integer(),
        Some(3),
        "the tenant's own"
    );
    assert_eq!(tenants[1]["session_limits"]["memory"].as_str(), Some("1g"));

    // A flag's variable overrides the file's key as the flag does; KERNELBOX_CONFIG names the file.
    let vars = [
        ("KERNELBOX_CONFIG", file.as_str()),
        ("KERNELBOX_IDLE_TIMEOUT", "11m"),
    ];
    let out = kernelbox_with(&["serve", "--print-config"], &vars);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let parsed: toml::Table = toml::from_str(&text(&out.stdout)).unwrap();
    assert_eq!(parsed["server"]["idle_timeout"].as_str(), Some("11m"));
    assert_eq!(
        parsed["server"]["max_kernels"].as_integer(),
        Some(5),
        "the file's key"
    );
}

#[test]
fn migrate_writes_a_file_that_resolves_to_what_the_flags_did() {
    let dir = tempfile::tempdir().unwrap();
    let tenants = json!({"tenants": [
        {"name": "acme", "token_sha256": HASH_A, "max_kernels": 4, "reserved": 1,
         "network": {"allow": ["pypi"]}, "audit": {"code": true},
         "workspaces": {"quota": "64m", "ttl": "1d"}, "session_limits": {"memory": "1g"}},
    ]});
    let json = write(dir.path(), "tenants.json", &tenants.to_string());
    let state = dir.path().join("state").display().to_string();
    let admin = write(dir.path(), "admin", "admin-secret\n");
    let flags = [
        "--tenants",
        json.as_str(),
        "--state-dir",
        state.as_str(),
        "--max-kernels",
        "12",
        "--idle-timeout",
        "7m",
        "--memory",
        "768m",
        "--pool-preload",
        "json,re",
        "--min-send-rate",
        "0",
        "--admin-token-file",
        admin.as_str(),
        "--label",
        "team=blue",
    ];
    let out = kernelbox(&[&["serve"][..], &flags, &["--print-config"]].concat());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let from_flags = text(&out.stdout);

    let migrated = dir.path().join("kernelbox.toml").display().to_string();
    let out = kernelbox(&[&["config", "migrate", "--output", &migrated][..], &flags].concat());
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = kernelbox(&["config", "check", &migrated]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = kernelbox(&["serve", "--config", &migrated, "--print-config"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), from_flags);
    assert!(!std::fs::read_to_string(&migrated)
        .unwrap()
        .contains("admin-secret"));
}

#[tokio::test(flavor = "multi_thread")]
async fn serve_with_a_config_file_serves_its_tenants_with_their_defaults() {
    let label = common::unique("config-serve");
    let engine = common::engine().await;
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let file = write(
        dir.path(),
        "k.toml",
        &format!(
            "[server]\nstate_dir = \"{}\"\n[pool]\nsize = 0\n\
             [tenant_defaults]\nsession_limits = {{ memory = \"256m\" }}\n\
             [[tenants]]\nname = \"alpha\"\ntoken = {{ env = \"CONFIG_TEST_ALPHA\" }}\n\
             [[tenants]]\nname = \"beta\"\ntoken = \"tok-config-beta\"\nsession_limits = {{ memory = \"1g\" }}\n",
            state.display()
        ),
    );
    let mut cmd = common::serve_command(&label, "unused");
    cmd.arg("--config")
        .arg(&file)
        .env("CONFIG_TEST_ALPHA", "tok-config-alpha")
        .env_remove("KERNELBOX_STATE_DIR");
    let (mut child, addr) = common::spawn_serving(cmd).await;
    let api = Api::new(addr);

    let result = api.run("tok-config-alpha", "s", "print(6 * 7)").await;
    assert_eq!(result["output"], "42\n", "{result}");
    let result = api.run("tok-config-beta", "s", "print('beta')").await;
    assert_eq!(result["output"], "beta\n", "{result}");
    // alpha's session limit is the default's 256m: asking for more is refused.
    let big = json!({"memory": "512m"}).to_string();
    let settings = "/v1/sessions/big/settings";
    let reply = api
        .put(
            settings,
            "tok-config-alpha",
            big.clone(),
            Some("application/json"),
        )
        .await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{}", reply.json());
    assert_eq!(
        reply.json()["error"]["code"],
        "settings_not_allowed",
        "{}",
        reply.json()
    );
    // beta's own 1g overrides the default.
    let reply = api
        .put(settings, "tok-config-beta", big, Some("application/json"))
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.json());
    let reply = api.execute("unused", "s", json!({"code": "1"})).await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED);

    let status = common::terminate(&mut child, std::time::Duration::from_secs(60)).await;
    assert!(status.success(), "{status}");
    common::assert_clean(&engine, &label).await;
}

/// `kernelbox ARGS...` killed after `secs` (a read that never ends must not hang `config
/// check`): its output, or `None` when it had to be killed.
fn kernelbox_within(args: &[&str], secs: u64) -> Option<Output> {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_kernelbox"));
    cmd.args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        if child.try_wait().unwrap().is_some() {
            return Some(child.wait_with_output().unwrap());
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[test]
fn a_secret_or_config_that_is_not_a_bounded_regular_file_is_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    assert!(std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let fifo = fifo.display().to_string();
    let big = dir.path().join("big");
    std::fs::write(&big, vec![b'x'; 2 << 20]).unwrap();
    let big = big.display().to_string();
    for source in [fifo.as_str(), "/dev/zero", big.as_str()] {
        let file = write(
            dir.path(),
            "t.toml",
            &format!("[[tenants]]\nname = \"a\"\ntoken = {{ file = \"{source}\" }}\n"),
        );
        let out = kernelbox_within(&["config", "check", &file], 60)
            .unwrap_or_else(|| panic!("config check hung reading the token file {source}"));
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{source}: {stderr}");
        assert!(stderr.contains("tenants[0].token"), "{source}: {stderr}");
    }
    // The configuration file itself.
    for source in [fifo.as_str(), "/dev/zero"] {
        let out = kernelbox_within(&["config", "check", source], 60)
            .unwrap_or_else(|| panic!("config check hung reading the file {source}"));
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{source}: {stderr}");
        assert!(stderr.contains("(file)"), "{source}: {stderr}");
    }
}

#[test]
fn the_redacted_placeholder_of_print_config_is_never_taken_as_a_secret() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "k.toml",
        "[cluster]\nadmin_token = \"admin-secret-1\"\n\
         [[tenants]]\nname = \"a\"\ntoken = \"tenant-secret-1\"\n",
    );
    let out = kernelbox(&["serve", "--config", &file, "--print-config"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let printed = write(dir.path(), "printed.toml", &text(&out.stdout));
    // Taken back as the configuration, every tenant's token (and the admin token) would be the
    // public word `<redacted>`: refused, naming the key.
    let out = kernelbox(&["config", "check", &printed]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("<redacted>"), "{stderr}");
    let out = kernelbox(&["serve", "--config", &printed, "--print-config"]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("cluster.admin_token"), "{stderr}");
}

#[test]
fn the_global_log_flags_may_follow_serve_with_a_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "k.toml", "[server]\nmax_kernels = 4\n");
    for args in [
        &[
            "serve",
            "--config",
            &file,
            "--log-format",
            "json",
            "--print-config",
        ][..],
        &[
            "serve",
            "--log-level=debug",
            "--config",
            &file,
            "--print-config",
        ][..],
        &[
            "--log-format",
            "json",
            "serve",
            "--config",
            &file,
            "--print-config",
        ][..],
    ] {
        let out = kernelbox(args);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{args:?}: {}",
            text(&out.stderr)
        );
        let parsed: toml::Table = toml::from_str(&text(&out.stdout)).unwrap();
        assert_eq!(parsed["server"]["max_kernels"].as_integer(), Some(4));
    }
}

#[test]
fn check_refuses_what_serve_refuses_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    for (body, key) in [
        ("[pool]\npreload = [\"not a module!\"]\n", "pool.preload"),
        ("[pool]\npreload = [\"numpy\", \"\"]\n", "pool.preload"),
        ("[kernels]\nmemory = \"1k\"\n", "kernels.memory"),
        ("[pool]\nlanguages = { python = 1 }\n", "pool.languages"),
        ("[pool]\nlanguages = { cobol = 1 }\n", "pool.languages"),
        ("[pool]\nlanguages = { bash = 100000 }\n", "pool.languages"),
    ] {
        let file = write(dir.path(), "k.toml", body);
        let out = kernelbox(&["config", "check", &file]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{body}: {stderr}");
        assert!(stderr.contains(key), "{body}: {stderr}");
    }
}

#[test]
fn a_label_key_the_flag_would_split_is_refused_not_changed() {
    let dir = tempfile::tempdir().unwrap();
    for body in [
        "[server.labels]\n\"team=a\" = \"b\"\n",
        "[server.labels]\n\"\" = \"b\"\n",
    ] {
        let file = write(dir.path(), "k.toml", body);
        let out = kernelbox(&["serve", "--config", &file, "--print-config"]);
        let stderr = text(&out.stderr);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{body}: {}{stderr}",
            text(&out.stdout)
        );
        assert!(stderr.contains("server.labels"), "{body}: {stderr}");
    }
}

#[test]
fn a_tenant_turns_off_the_workspaces_and_tools_its_defaults_give() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "k.toml",
        &format!(
            "[tenant_defaults]\nworkspaces = {{ quota = \"8m\" }}\n\
             tools = {{ url = \"http://127.0.0.1:9/tools\", allow = [\"search\"] }}\n\
             network = {{ allow = [\"pypi\"] }}\n\
             [[tenants]]\nname = \"wide\"\ntoken_sha256 = \"{HASH_A}\"\n\
             [[tenants]]\nname = \"narrow\"\ntoken = \"narrow-token-1\"\n\
             workspaces = false\ntools = false\nnetwork = {{ allow = [] }}\n"
        ),
    );
    let out = kernelbox(&["config", "check", &file]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = kernelbox(&["serve", "--config", &file, "--print-config"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let parsed: toml::Table = toml::from_str(&text(&out.stdout)).unwrap();
    let tenants = parsed["tenants"].as_array().unwrap();
    assert_eq!(tenants[0]["workspaces"]["quota"].as_str(), Some("8m"));
    assert!(tenants[0]["tools"].is_table());
    assert_eq!(tenants[1]["workspaces"].as_bool(), Some(false));
    assert_eq!(tenants[1]["tools"].as_bool(), Some(false));
    assert!(tenants[1]["network"]["allow"]
        .as_array()
        .unwrap()
        .is_empty());
    // `true` is no table: refused, named.
    let file = write(
        dir.path(),
        "t.toml",
        &format!("[[tenants]]\nname = \"a\"\ntoken_sha256 = \"{HASH_A}\"\nworkspaces = true\n"),
    );
    let out = kernelbox(&["config", "check", &file]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("tenants[0].workspaces"), "{stderr}");
}
