//! The parsers of what each client says, on texts in the clients' own
//! formats (names of the documentation domains), and the whole resolution
//! against the real clients where they are installed (tests/tests escape
//! cases drive it through runs).

use super::*;

#[test]
fn pip_config_gives_index_and_extra_urls_from_files_and_variables() {
    let text = ":env:.index-url='https://pkgs.example/simple'\n\
                :env:.cert='/etc/ssl/certs/ca-certificates.crt'\n\
                global.extra-index-url='https://a.example/simple https://b.example:8443/simple'\n\
                global.find-links='/opt/wheels'\n";
    assert_eq!(
        pip_config_urls(text),
        vec![
            "https://pkgs.example/simple",
            "https://a.example/simple",
            "https://b.example:8443/simple"
        ]
    );
    assert!(pip_config_urls("global.cert='/x'\n").is_empty());
}

#[test]
fn npm_config_gives_the_registry_and_scoped_ones() {
    let json = r#"{"registry":"https://npm.example/","@corp:registry":"https://corp.example:4873/","cafile":"/x","fund":false}"#;
    let mut urls = npm_config_urls(json).unwrap();
    urls.sort();
    assert_eq!(
        urls,
        vec!["https://corp.example:4873/", "https://npm.example/"]
    );
    assert!(npm_config_urls("[]").is_err());
}

#[test]
fn cargo_config_gives_replaced_sources_and_named_registries() {
    let text = "[source.crates-io]\nreplace-with = \"mirror\"\n\
                [source.mirror]\nregistry = \"sparse+https://mirror.example/index/\"\n\
                [registries.corp]\nindex = \"https://git.corp.example/index.git\"\n\
                [net]\ngit-fetch-with-cli = true\n";
    let mut urls = cargo_config_urls(text).unwrap();
    urls.sort();
    assert_eq!(
        urls,
        vec![
            "https://git.corp.example/index.git",
            "sparse+https://mirror.example/index/"
        ]
    );
    assert!(cargo_config_urls("[source\n").is_err());
}

#[test]
fn cargo_index_caches_are_named_by_host_and_say_where_crates_come_from() {
    assert_eq!(
        cache_dir_host("index.crates.example-1949cf8c6b5b557f"),
        Some("index.crates.example")
    );
    assert_eq!(cache_dir_host("github.example-abc"), None);
    assert_eq!(cache_dir_host("-1949cf8c6b5b557f"), None);
    let json = r#"{"dl": "https://dl.example:443/api/v1/crates", "api": "https://api.example"}"#;
    assert_eq!(
        cargo_index_config_urls(json),
        vec![
            "https://dl.example:443/api/v1/crates",
            "https://api.example"
        ]
    );
    assert!(cargo_index_config_urls("not json").is_empty());
}

#[test]
fn urls_become_hosts_and_ports() {
    let r = Registry::Cargo;
    assert_eq!(
        endpoint(r, "sparse+https://Index.Example/").unwrap(),
        Endpoint {
            host: "index.example".into(),
            port: 443
        }
    );
    assert_eq!(
        endpoint(r, "http://deb.example/debian/dists/x")
            .unwrap()
            .port,
        80
    );
    assert_eq!(endpoint(r, "https://x.example:8443/").unwrap().port, 8443);
    assert!(endpoint(r, "/opt/wheels").is_err());
    assert!(endpoint(r, "ssh://git@x.example/index").is_err());
}

#[test]
fn applying_adds_each_host_once_and_refuses_a_port_not_allowed() {
    // Exercised through `apply` with a registry already in the cache.
    let mut net = NetPolicy {
        mode: crate::policy::NetMode::Allowlist,
        allow: vec![HostPattern::parse("pkgs.example").unwrap()],
        ..NetPolicy::default()
    };
    let add = |net: &mut NetPolicy, eps: &[(&str, u16)]| {
        let resolved = Resolved {
            registry: Registry::Npm,
            endpoints: eps
                .iter()
                .map(|(h, p)| Endpoint {
                    host: h.to_string(),
                    port: *p,
                })
                .collect(),
            from: "test".into(),
        };
        add_endpoints(net, &resolved)
    };
    add(&mut net, &[("pkgs.example", 443), ("npm.example", 443)]).unwrap();
    assert_eq!(
        net.allow,
        vec![
            HostPattern::parse("pkgs.example").unwrap(),
            HostPattern::parse("npm.example").unwrap()
        ]
    );
    let e = add(&mut net, &[("odd.example", 4873)]).unwrap_err();
    assert!(e.to_string().contains("port 4873"), "{e}");
    assert!(!net
        .allow
        .contains(&HostPattern::parse("odd.example").unwrap()));
}
