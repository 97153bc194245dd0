use std::net::IpAddr;

use axum::http::{HeaderMap, HeaderValue};
use proptest::prelude::*;

use super::*;

fn view<'a>(headers: &'a HeaderMap, path: &'a str, client: &str) -> RequestView<'a> {
    RequestView {
        path: Some(path),
        method: Some("GET"),
        host: Some("shop.example.com"),
        client: Some(client.parse().unwrap()),
        headers,
    }
}

fn rule(action: Action, f: impl FnOnce(&mut Rule)) -> Rule {
    let mut r = Rule::new(action);
    f(&mut r);
    r
}

fn set(rules: &[Rule]) -> RuleSet {
    RuleSet::compile(rules).expect("valid rules")
}

#[test]
fn the_first_rule_that_matches_decides() {
    let rules = set(&[
        rule(Action::Bypass, |r| r.path_prefix = vec!["/health".into()]),
        rule(Action::Block, |r| {
            r.network = vec!["203.0.113.0/24".parse().unwrap()]
        }),
        rule(Action::Bypass, |r| r.path = vec!["/static/**".into()]),
    ]);
    let h = HeaderMap::new();
    assert_eq!(
        rules.first_match(&view(&h, "/health", "203.0.113.9")),
        Some((0, Action::Bypass))
    );
    assert_eq!(
        rules.first_match(&view(&h, "/static/a.css", "203.0.113.9")),
        Some((1, Action::Block))
    );
    assert_eq!(
        rules.first_match(&view(&h, "/static/a/b.css", "198.51.100.1")),
        Some((2, Action::Bypass))
    );
    assert_eq!(
        rules.first_match(&view(&h, "/tickets", "198.51.100.1")),
        None
    );
    assert!(rules.needs_client());
}

#[test]
fn every_condition_of_a_rule_must_hold() {
    let rules = set(&[rule(Action::Bypass, |r| {
        r.path = vec!["/products/*".into()];
        r.method = vec!["GET".into(), "HEAD".into()];
        r.host = vec!["*.example.com".into()];
        r.user_agent = vec!["googlebot".into()];
    })]);
    let mut h = HeaderMap::new();
    h.insert(
        "user-agent",
        HeaderValue::from_static("Mozilla/5.0 (compatible; Googlebot/2.1)"),
    );
    let hit = view(&h, "/products/shoe", "192.0.2.1");
    assert_eq!(rules.first_match(&hit), Some((0, Action::Bypass)));
    // `*` stays within a segment.
    assert_eq!(
        rules.first_match(&view(&h, "/products/shoe/reviews", "192.0.2.1")),
        None
    );
    assert_eq!(
        rules.first_match(&RequestView {
            method: Some("POST"),
            ..hit
        }),
        None
    );
    assert_eq!(
        rules.first_match(&RequestView {
            method: None,
            ..hit
        }),
        None
    );
    assert_eq!(
        rules.first_match(&RequestView {
            host: Some("example.com"),
            ..hit
        }),
        None
    );
    assert_eq!(
        rules.first_match(&RequestView {
            host: Some("A.EXAMPLE.COM"),
            ..hit
        }),
        Some((0, Action::Bypass))
    );
    assert_eq!(rules.first_match(&RequestView { path: None, ..hit }), None);
    let other = HeaderMap::new();
    assert_eq!(
        rules.first_match(&RequestView {
            headers: &other,
            ..hit
        }),
        None
    );
}

#[test]
fn headers_and_cookies_match_by_name_or_by_value() {
    let rules = set(&[
        rule(Action::Bypass, |r| {
            r.header = vec![Named {
                name: "x-partner".into(),
                value: Some("acme".into()),
            }]
        }),
        rule(Action::Block, |r| {
            r.cookie = vec![Named {
                name: "bad".into(),
                value: None,
            }]
        }),
    ]);
    let mut h = HeaderMap::new();
    h.insert("x-partner", HeaderValue::from_static("acme"));
    assert_eq!(
        rules.first_match(&view(&h, "/", "192.0.2.1")),
        Some((0, Action::Bypass))
    );
    h.insert("x-partner", HeaderValue::from_static("other"));
    assert_eq!(rules.first_match(&view(&h, "/", "192.0.2.1")), None);
    h.insert("cookie", HeaderValue::from_static("a=1; bad=x"));
    assert_eq!(
        rules.first_match(&view(&h, "/", "192.0.2.1")),
        Some((1, Action::Block))
    );
    h.insert("cookie", HeaderValue::from_static("a=1; notbad=x"));
    assert_eq!(rules.first_match(&view(&h, "/", "192.0.2.1")), None);
}

#[test]
fn an_ipv4_client_over_ipv6_is_in_its_ipv4_network() {
    let rules = set(&[rule(Action::Block, |r| {
        r.network = vec!["203.0.113.0/24".parse().unwrap()]
    })]);
    let h = HeaderMap::new();
    assert!(
        rules
            .first_match(&view(&h, "/", "::ffff:203.0.113.7"))
            .is_some()
    );
    let mut v = view(&h, "/", "192.0.2.1");
    v.client = None;
    assert_eq!(rules.first_match(&v), None);
}

#[test]
fn the_view_reads_what_the_proxy_sends() {
    let mut h = HeaderMap::new();
    h.insert("host", HeaderValue::from_static("narabu:8080"));
    h.insert("x-original-uri", HeaderValue::from_static("/a/b?c=d"));
    h.insert("x-forwarded-method", HeaderValue::from_static("POST"));
    let v = RequestView::from_proxy(&h, None);
    assert_eq!(
        (v.path, v.method, v.host),
        (Some("/a/b"), Some("POST"), Some("narabu"))
    );
    h.insert(
        "x-forwarded-host",
        HeaderValue::from_static("shop.example.com:443, proxy"),
    );
    h.remove("x-original-uri");
    h.insert("x-forwarded-uri", HeaderValue::from_static("/x"));
    let v = RequestView::from_proxy(&h, None);
    assert_eq!((v.path, v.host), (Some("/x"), Some("shop.example.com")));
    h.insert("x-forwarded-host", HeaderValue::from_static("[::1]:80"));
    assert_eq!(RequestView::from_proxy(&h, None).host, Some("::1"));
}

#[test]
fn bad_rules_are_refused_naming_the_rule_and_field() {
    let cases: Vec<(Rule, &str)> = vec![
        (
            rule(Action::Bypass, |r| r.path_prefix = vec!["static".into()]),
            "rules[1].path_prefix[0]",
        ),
        (
            rule(Action::Bypass, |r| r.path = vec!["/a".into(), "/[".into()]),
            "rules[1].path[1]",
        ),
        (
            rule(Action::Bypass, |r| r.method = vec!["get".into()]),
            "rules[1].method[0]",
        ),
        (
            rule(Action::Bypass, |r| {
                r.host = vec!["Shop.example.com:80".into()]
            }),
            "rules[1].host[0]",
        ),
        (
            rule(Action::Bypass, |r| {
                r.header = vec![Named {
                    name: "X Bad".into(),
                    value: None,
                }]
            }),
            "rules[1].header[0].name",
        ),
        (
            rule(Action::Bypass, |r| {
                r.cookie = vec![Named {
                    name: "a".into(),
                    value: Some("\n".into()),
                }]
            }),
            "rules[1].cookie[0].value",
        ),
        (
            rule(Action::Bypass, |r| r.user_agent = vec![String::new()]),
            "rules[1].user_agent[0]",
        ),
        (
            rule(Action::Bypass, |r| r.name = Some("first".into())),
            "rules[1].name",
        ),
        (
            rule(Action::Bypass, |r| r.name = Some("Upper".into())),
            "rules[1].name",
        ),
        // A join carries no page of the site to match a path against.
        (
            rule(Action::Shadow, |r| r.path_prefix = vec!["/".into()]),
            "rules[1].path_prefix",
        ),
        (
            rule(Action::Shadow, |r| r.method = vec!["GET".into()]),
            "rules[1].method",
        ),
    ];
    for (bad, field) in cases {
        let first = rule(Action::Queue, |r| r.name = Some("first".into()));
        let e = validate(&[first, bad]).unwrap_err();
        assert_eq!(e.field, field, "{e:?}");
        assert!(!e.message.is_empty());
    }
    let many = vec![Rule::new(Action::Queue); MAX_RULES + 1];
    assert_eq!(validate(&many).unwrap_err().field, "rules");
}

#[test]
fn rules_read_from_json_and_toml_alike() {
    let json: Vec<Rule> = serde_json::from_str(
        r#"[{"action":"bypass","path_prefix":["/health"]},{"action":"block","network":["203.0.113.0/24"]}]"#,
    )
    .unwrap();
    #[derive(Deserialize)]
    struct T {
        rules: Vec<Rule>,
    }
    let toml: T = toml::from_str(
        "[[rules]]\naction = \"bypass\"\npath_prefix = [\"/health\"]\n[[rules]]\naction = \"block\"\nnetwork = [\"203.0.113.0/24\"]\n",
    )
    .unwrap();
    assert_eq!(json, toml.rules);
    assert!(serde_json::from_str::<Vec<Rule>>(r#"[{"action":"maybe"}]"#).is_err());
    assert!(serde_json::from_str::<Vec<Rule>>(r#"[{"action":"bypass","paths":[]}]"#).is_err());
    // The backends' compact encoding reads them back whole.
    let bytes = postcard::to_allocvec(&json).unwrap();
    assert_eq!(postcard::from_bytes::<Vec<Rule>>(&bytes).unwrap(), json);
}

fn segment() -> impl Strategy<Value = String> {
    "[a-c]{1,3}"
}

proptest! {
    /// A path prefix rule matches exactly the paths that start with it,
    /// and `/**` under a directory matches exactly what lies beneath it.
    #[test]
    fn prefixes_and_globs_agree_with_their_meaning(
        dir in prop::collection::vec(segment(), 1..3),
        path in prop::collection::vec(segment(), 0..5),
    ) {
        let dir = format!("/{}", dir.join("/"));
        let path = format!("/{}", path.join("/"));
        let prefix = set(&[rule(Action::Bypass, |r| r.path_prefix = vec![dir.clone()])]);
        let globbed = set(&[rule(Action::Bypass, |r| r.path = vec![format!("{dir}/**")])]);
        let h = HeaderMap::new();
        let v = view(&h, &path, "192.0.2.1");
        prop_assert_eq!(prefix.first_match(&v).is_some(), path.starts_with(&dir));
        prop_assert_eq!(globbed.first_match(&v).is_some(), path.starts_with(&format!("{dir}/")));
    }

    /// A network rule matches exactly the addresses inside it, and the
    /// first of several rules that match is the one reported.
    #[test]
    fn networks_match_their_addresses_and_order_decides(
        a in any::<u32>(), b in any::<u32>(), len in 0u8..=32,
    ) {
        let net: IpNet = ipnet::Ipv4Net::new(a.into(), len).unwrap().trunc().into();
        let rules = set(&[
            rule(Action::Block, |r| r.network = vec![net]),
            Rule::new(Action::Queue),
        ]);
        let ip = IpAddr::from(std::net::Ipv4Addr::from(b));
        let h = HeaderMap::new();
        let v = RequestView { client: Some(ip), ..view(&h, "/", "192.0.2.1") };
        let want = if net.contains(&ip) { (0, Action::Block) } else { (1, Action::Queue) };
        prop_assert_eq!(rules.first_match(&v), Some(want));
    }
}

#[test]
fn a_network_file_reads_one_network_a_line_and_names_a_bad_line() {
    let text = "# scrapers\n203.0.113.0/24\n\n  198.51.100.7   # one address\n2001:db8::/32\n";
    let nets = parse_networks(text).unwrap();
    assert_eq!(
        nets,
        ["203.0.113.0/24", "198.51.100.7/32", "2001:db8::/32"].map(|n| n.parse::<IpNet>().unwrap())
    );
    let e = parse_networks("203.0.113.0/24\n\n10.0.0.0/33\n").unwrap_err();
    assert_eq!(e.line, 3);
    // What the line says is not repeated (the file may be a key).
    assert!(!e.message.contains("10.0.0.0"), "{e:?}");

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.txt");
    std::fs::write(&bad, "203.0.113.0/24\nnot-a-network\n").unwrap();
    let rules = [
        Rule::new(Action::Queue),
        rule(Action::Shadow, |r| {
            r.network_file = Some(bad.to_str().unwrap().to_owned())
        }),
    ];
    assert!(validate(&rules).is_ok());
    let e = check_files(&rules).unwrap_err();
    assert_eq!(e.field, "rules[1].network_file");
    assert!(
        e.message.contains("bad.txt") && e.message.contains("line 2"),
        "{e:?}"
    );
    let missing = [rule(Action::Block, |r| {
        r.network_file = Some(dir.path().join("none").to_str().unwrap().to_owned())
    })];
    assert_eq!(
        check_files(&missing).unwrap_err().field,
        "rules[0].network_file"
    );
    let empty = [rule(Action::Block, |r| {
        r.network_file = Some(String::new())
    })];
    assert_eq!(validate(&empty).unwrap_err().field, "rules[0].network_file");
}

#[test]
fn a_rule_takes_its_files_networks_with_its_own() {
    let rules = [rule(Action::Block, |r| {
        r.network = vec!["192.0.2.0/24".parse().unwrap()];
        r.network_file = Some("/scrapers".into());
    })];
    let h = HeaderMap::new();
    let asks = |set: &RuleSet, ip: &str| set.first_match(&view(&h, "/", ip)).is_some();
    let listed: Arc<[IpNet]> = vec!["203.0.113.0/24".parse().unwrap()].into();
    let with =
        RuleSet::compile_with(&rules, |p| (p == "/scrapers").then(|| listed.clone())).unwrap();
    assert!(asks(&with, "192.0.2.1") && asks(&with, "203.0.113.9"));
    assert!(!asks(&with, "198.51.100.1"));
    // A file not read adds nothing: the rule's own networks still count.
    let without = RuleSet::compile(&rules).unwrap();
    assert!(asks(&without, "192.0.2.1") && !asks(&without, "203.0.113.9"));
    let only_file = [rule(Action::Block, |r| r.network_file = Some("/x".into()))];
    assert!(!asks(&RuleSet::compile(&only_file).unwrap(), "192.0.2.1"));
}

proptest! {
    /// However many networks, overlapping or not, of either family: an
    /// address is in the merged list exactly when it is in one of them.
    #[test]
    fn a_merged_list_holds_what_its_networks_hold(
        v4 in prop::collection::vec((any::<u32>(), 0u8..=32), 0..40),
        v6 in prop::collection::vec((any::<u128>(), 0u8..=128), 0..10),
        probes in prop::collection::vec(any::<u32>(), 1..20),
        near in any::<u8>(),
    ) {
        let mut nets: Vec<IpNet> = v4
            .iter()
            .map(|&(a, l)| ipnet::Ipv4Net::new(a.into(), l).unwrap().into())
            .collect();
        nets.extend(v6.iter().map(|&(a, l)| IpNet::from(ipnet::Ipv6Net::new(a.into(), l).unwrap())));
        let merged = Networks::new(&nets);
        // Random addresses, and ones at the networks' edges.
        let mut ips: Vec<IpAddr> = probes.iter().map(|&p| IpAddr::from(std::net::Ipv4Addr::from(p))).collect();
        for n in nets.iter().take(usize::from(near % 8) + 1) {
            ips.push(n.network());
            ips.push(n.broadcast());
        }
        if let Some(&(a, _)) = v6.first() {
            ips.push(IpAddr::from(std::net::Ipv6Addr::from(a)));
        }
        for ip in ips {
            prop_assert_eq!(merged.contains(ip), nets.iter().any(|n| n.contains(&ip)), "{}", ip);
        }
    }
}
