use std::path::Path;

use super::*;

#[test]
fn a_bad_key_is_named_with_its_path_line_and_column() {
    let text = "[server]\nmax_kernels = 4\n\n[[tenants]]\nname = \"a\"\n\n[[tenants]]\nname = \"b\"\nmax_kernls = 3\n";
    let e = ConfigFile::parse(text, Path::new("k.toml")).unwrap_err();
    assert_eq!(e.key, "tenants[1].max_kernls");
    assert_eq!(e.at, Some((9, 1)));
    assert!(e.reason.contains("unknown field"), "{e}");
    let e =
        ConfigFile::parse("[limits]\nsend_timeout = \"soon\"\n", Path::new("k.toml")).unwrap_err();
    assert_eq!(e.key, "limits.send_timeout", "{e}");
    let e = ConfigFile::parse("[kernels]\nmemory = -5\n", Path::new("k.toml")).unwrap_err();
    assert_eq!(e.key, "kernels.memory", "{e}");
}

#[test]
fn defaults_fill_what_a_tenant_leaves_out_and_secrets_never_print() {
    let text = "[tenant_defaults]\nmax_kernels = 2\nhibernate = true\n[cluster]\nadmin_token = \"hunter2\"\n[[tenants]]\nname = \"a\"\ntoken = \"s3cret\"\nmax_kernels = 5\n";
    let file = ConfigFile::parse(text, Path::new("k.toml")).unwrap();
    let a = file.tenants[0].with_defaults(&file.tenant_defaults);
    assert_eq!(a.max_kernels, Some(5));
    assert_eq!(a.hibernate, Some(true));
    let printed = file.to_toml();
    assert!(
        !printed.contains("hunter2") && !printed.contains("s3cret"),
        "{printed}"
    );
    assert!(!format!("{file:?}").contains("s3cret"));
    let e =
        ConfigFile::parse("[tenant_defaults]\nname = \"x\"\n", Path::new("k.toml")).unwrap_err();
    assert_eq!(e.key, "tenant_defaults.name");

    // The tables of a secret and an audit refuse a key they do not know.
    let e = ConfigFile::parse(
        "[cluster]\nadmin_token = { file = \"/x\", env = \"Y\" }\n",
        Path::new("k.toml"),
    )
    .unwrap_err();
    assert_eq!(e.key, "cluster.admin_token", "{e}");
    let e = ConfigFile::parse(
        "[tenant_defaults]\naudit = { code = true, output = true }\n",
        Path::new("k.toml"),
    )
    .unwrap_err();
    assert_eq!(e.key, "tenant_defaults.audit", "{e}");
}

#[test]
fn a_tenant_turned_off_has_no_workspaces_or_tools_of_its_defaults() {
    let hash = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
    let text = format!(
        "[tenant_defaults]\nworkspaces = {{ quota = \"8m\" }}\n\
         tools = {{ url = \"http://127.0.0.1:9/t\", allow = [\"f\"] }}\n\
         [[tenants]]\nname = \"wide\"\ntoken_sha256 = \"{hash}\"\n\
         [[tenants]]\nname = \"narrow\"\ntoken = \"n-token\"\nworkspaces = false\ntools = false\n"
    );
    let file = ConfigFile::parse(&text, Path::new("k.toml")).unwrap();
    let entries: Vec<TenantEntry> = file
        .tenants
        .iter()
        .map(|t| t.with_defaults(&file.tenant_defaults))
        .collect();
    let tenants = crate::server::Tenants::from_entries(&entries, Path::new("k.toml")).unwrap();
    let workspaces = tenants.workspaces();
    assert!(workspaces.contains_key("wide"), "{workspaces:?}");
    assert!(!workspaces.contains_key("narrow"), "{workspaces:?}");
}
