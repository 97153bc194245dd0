use std::collections::HashMap;
use std::time::Duration;

use super::*;
use crate::engine::Order;

const EXAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/config/narabu.toml");
const SECRET_A: &str = "0123456789abcdef0123456789abcdef-secret-a";
const SECRET_B: &str = "0123456789abcdef0123456789abcdef-secret-b";

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::from_toml_str(text, "test.toml")
}

fn err(text: &str) -> String {
    match parse(text) {
        Ok(c) => panic!("expected an error for:\n{text}\ngot {c:?}"),
        Err(e) => e.to_string(),
    }
}

fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| map.get(k).cloned()
}

/// The example with every commented-out setting switched on, so that the
/// examples a reader would copy are checked too.
fn example_uncommented() -> String {
    let text = std::fs::read_to_string(EXAMPLE).expect("the example config exists");
    text.lines()
        .map(|line| match line.strip_prefix("# ") {
            Some(rest)
                if rest.starts_with("# ")
                    || rest.starts_with('[')
                    || rest.split_once(" = ").is_some_and(|(k, _)| {
                        k.chars().all(|c| c.is_ascii_lowercase() || c == '_')
                    }) =>
            {
                rest
            }
            _ => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
        .replace("backend = \"embedded\"", "backend = \"redis\"")
}

#[test]
fn default_is_the_no_argument_setup() {
    let c = Config::default();
    assert_eq!(c.listen, "127.0.0.1:8080".parse().expect("an address"));
    assert_eq!(c.data_dir, PathBuf::from("./narabu-data"));
    assert!(matches!(c.backend, Backend::Embedded));
    assert!(c.secret.is_none() && c.previous_secret.is_none() && c.admin_token.is_none());
    assert!(!c.cookie_secure);
    assert!(c.trusted_proxies.is_empty());
    assert_eq!(c.log_format, LogFormat::Plain);
    assert_eq!(c.on_backend_error, OnBackendError::Closed);
    assert_eq!(c.max_streams_per_address, 2000);
    assert_eq!(c.max_streams_per_ticket, 4);
    assert_eq!(c.public_url, None);
    assert!(c.webhooks.is_empty());
    assert_eq!(c.rooms.len(), 1);
    assert_eq!(c.rooms[0].id.as_str(), "default");
    assert_eq!(c.rooms[0].capacity, 100);
    assert_eq!(c.rooms[0], RoomSettings::new(c.rooms[0].id.clone()));
}

#[test]
fn a_bad_autotune_section_names_its_field() {
    let e = parse(
        "[[rooms]]\nid = \"sale\"\n[rooms.autotune]\nmin_rate = 60\nmax_rate = 10\nprobe = { url = \"http://origin/\" }\n",
    )
    .expect_err("max_rate under min_rate");
    assert_eq!(e.field(), "rooms[0].autotune.max_rate");
    let e = parse("[[rooms]]\nid = \"sale\"\n[rooms.autotune]\nmin_rate = 60\nmax_rate = 600\n")
        .expect_err("no signal");
    assert_eq!(e.field(), "rooms[0].autotune.probe");
}

#[test]
fn an_empty_file_is_the_default() {
    let c = parse("").expect("an empty file is valid");
    assert_eq!(format!("{c:?}"), format!("{:?}", Config::default()));
}

#[test]
fn the_example_file_loads_and_matches_the_defaults() {
    let c = Config::load(Path::new(EXAMPLE)).expect("the example is valid");
    assert_eq!(format!("{c:?}"), format!("{:?}", Config::default()));
}

#[test]
fn every_commented_example_in_the_example_file_is_valid() {
    let text = example_uncommented();
    let mut c = Config::from_toml_str(&text, "narabu.toml (uncommented)")
        .unwrap_or_else(|e| panic!("{e}\n{text}"));
    match &c.backend {
        // redis_url beside the cluster's seed nodes is one more seed.
        Backend::Redis(RedisTarget::Cluster { nodes }) => {
            assert_eq!(nodes[0], "redis://127.0.0.1:6379");
            assert_eq!(nodes.len(), 3);
        }
        other => panic!("expected a Redis Cluster, got {other:?}"),
    }
    assert!(c.secret.is_some() && c.previous_secret.is_some() && c.admin_token.is_some());
    let tuned = c.rooms[0]
        .autotune
        .as_deref()
        .expect("the autotune example");
    assert_eq!((tuned.min_rate, tuned.max_rate), (60, 6000));
    assert!(tuned.probe.is_some() && tuned.metrics.is_some());
    assert_eq!(c.trusted_proxies.len(), 3);
    assert_eq!(c.public_url.as_deref(), Some("https://queue.example.com"));
    assert_eq!(
        c.templates_dir.as_deref(),
        Some(Path::new("/etc/narabu/pages"))
    );
    assert_eq!(
        c.messages_dir.as_deref(),
        Some(Path::new("/etc/narabu/messages"))
    );
    assert_eq!(
        c.rooms[0].templates_dir.as_deref(),
        Some("/etc/narabu/pages/default")
    );
    assert_eq!(c.webhooks.len(), 1);
    assert_eq!(c.webhooks[0].events.len(), 3);
    assert_eq!(c.webhooks[0].queue_threshold, Some(10_000));
    assert!(c.webhooks[0].previous_secret.is_some());
    assert_eq!(c.rooms.len(), 2);
    assert_eq!(c.rooms[0].admit_per_minute, Some(600));
    let rules = &c.rooms[0].rules;
    assert_eq!(rules.len(), 3);
    assert_eq!(
        (rules[0].action, rules[1].action, rules[2].action),
        (
            crate::rules::Action::Bypass,
            crate::rules::Action::Block,
            crate::rules::Action::Shadow
        )
    );
    assert_eq!(rules[1].network.len(), 2);
    assert_eq!(c.rooms[0].opens_at, c.rooms[1].opens_at);
    assert_eq!(c.rooms[1].opens_at, Some(1_796_086_800_000));
    assert_eq!(c.rooms[1].capacity, 500);
    let access = &c.rooms[0].access;
    assert!(access.enqueue_key.is_some() && access.enqueue_previous_key.is_some());
    assert!(access.enqueue_public_key.is_some() && access.enqueue_previous_public_key.is_some());
    assert_eq!(c.pass_algorithm, crate::pass::PassAlgorithm::ES256);
    assert!(c.pass_key_file.is_some() && c.previous_pass_key_file.is_some());
    c.apply_env(env(&[]))
        .expect("the secret is set, so redis is fine");
}

#[test]
fn every_top_level_key_is_read() {
    let c = parse(&format!(
        r#"
listen = "0.0.0.0:9000"
data_dir = "/var/lib/narabu"
backend = "redis"
redis_url = "rediss://:pw@redis.internal:6380/0"
redis_cluster_nodes = ["redis://a:6379", "redis://b:6379"]
secret = "{SECRET_A}"
previous_secret = "{SECRET_B}"
admin_token = "{SECRET_A}"
cookie_secure = true
trusted_proxies = ["10.1.2.3/8", "192.168.0.7", "::1", "fd00::/8"]
log_format = "json"
on_backend_error = "open"
max_streams_per_address = 0
public_url = "https://q.example.com/"

[[webhooks]]
url = "https://hooks.example.com/x"
secret = "{SECRET_B}"

[[rooms]]
id = "a"

[[rooms]]
id = "b"
capacity = 3
order = "fifo"
"#
    ))
    .expect("a full config");
    assert_eq!(c.listen.port(), 9000);
    assert_eq!(c.data_dir, PathBuf::from("/var/lib/narabu"));
    match &c.backend {
        Backend::Redis(RedisTarget::Cluster { nodes }) => assert_eq!(
            nodes,
            &[
                "rediss://:pw@redis.internal:6380/0",
                "redis://a:6379",
                "redis://b:6379"
            ]
        ),
        other => panic!("expected a Redis Cluster, got {other:?}"),
    }
    assert_eq!(c.secret.as_ref().map(Secret::expose), Some(SECRET_A));
    assert_eq!(
        c.previous_secret.as_ref().map(Secret::expose),
        Some(SECRET_B)
    );
    assert_eq!(c.admin_token.as_ref().map(Secret::expose), Some(SECRET_A));
    assert!(c.cookie_secure);
    let nets: Vec<String> = c.trusted_proxies.iter().map(|n| n.to_string()).collect();
    assert_eq!(
        nets,
        ["10.0.0.0/8", "192.168.0.7/32", "::1/128", "fd00::/8"]
    );
    assert_eq!(c.log_format, LogFormat::Json);
    assert_eq!(c.on_backend_error, OnBackendError::Open);
    assert_eq!(c.max_streams_per_address, 0);
    assert_eq!(c.public_url.as_deref(), Some("https://q.example.com"));
    assert_eq!(c.webhooks[0].url, "https://hooks.example.com/x");
    assert!(c.webhooks[0].events.is_empty());
    let ids: Vec<&str> = c.rooms.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["a", "b"]);
    assert_eq!(c.rooms[0].capacity, 100);
    assert_eq!(c.rooms[1].capacity, 3);
    assert_eq!(c.rooms[1].order, Order::Fifo);
    assert_eq!(c.rooms[1].tick, Duration::from_secs(1));
}

#[test]
fn errors_name_the_file_the_field_and_the_problem() {
    let text = "[[rooms]]\nid = \"a\"\n\n[[rooms]]\nid = \"b\"\ncapacity = 0\n";
    let e = Config::from_toml_str(text, "config/narabu.toml").expect_err("capacity 0");
    assert_eq!(
        e.to_string(),
        "config/narabu.toml: rooms[1].capacity: must be between 1 and 1000000, got 0"
    );
    assert_eq!(e.origin(), "config/narabu.toml");
    assert_eq!(e.field(), "rooms[1].capacity");
    assert_eq!(e.message(), "must be between 1 and 1000000, got 0");
}

#[test]
fn bad_rules_name_the_room_the_rule_and_the_field() {
    let text = "[[rooms]]\nid = \"a\"\n[[rooms.rules]]\naction = \"bypass\"\n[[rooms.rules]]\naction = \"block\"\nnetwork = [\"10.0.0.0/8\", \"bad\"]\n";
    let e = err(text);
    assert!(
        e.starts_with("test.toml: rooms[0].rules[1].network[1]: "),
        "{e}"
    );
    let text = "[[rooms]]\nid = \"a\"\n[[rooms.rules]]\naction = \"bypass\"\npath = [\"/a/[\"]\n";
    assert!(err(text).starts_with("test.toml: rooms[0].rules[0].path[0]: not a glob"));
    let text = "[[rooms]]\nid = \"a\"\n[[rooms.rules]]\naction = \"allow\"\n";
    assert!(err(text).starts_with("test.toml: rooms[0].rules[0].action: unknown variant"));
    // A network file that does not read stops the start, naming the rule,
    // the field, the file and its line.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("scrapers.txt");
    std::fs::write(&file, "# scrapers\n203.0.113.0/24\n203.0.113.300\n").unwrap();
    let text = format!(
        "[[rooms]]\nid = \"a\"\n[[rooms.rules]]\naction = \"queue\"\n[[rooms.rules]]\naction = \"shadow\"\nnetwork_file = {:?}\n",
        file.to_str().unwrap()
    );
    let e = err(&text);
    assert!(
        e.starts_with("test.toml: rooms[0].rules[1].network_file: ")
            && e.contains("scrapers.txt: line 3: "),
        "{e}"
    );
    std::fs::write(&file, "203.0.113.0/24\n").unwrap();
    assert!(parse(&text).is_ok());
}

#[test]
fn two_rooms_with_one_route_are_refused_naming_both() {
    let text = "[[rooms]]\nid = \"a\"\nroutes = [{ path_prefix = \"/a/\" }, { host = \"shop.example.com\", path_prefix = \"/\" }]\n\
                [[rooms]]\nid = \"b\"\nroutes = [{ host = \"shop.example.com\", path_prefix = \"/\" }]\n";
    assert_eq!(
        err(text),
        "test.toml: rooms[1].routes[0]: the same route as rooms[0] (\"a\"): a route leads to one room"
    );
    let text = "[[rooms]]\nid = \"a\"\nroutes = [{ path_prefix = \"a/\" }]\n";
    assert!(err(text).starts_with("test.toml: rooms[0].routes[0].path_prefix: "));
    let text = "[[rooms]]\nid = \"a\"\nroutes = [{ path_prefix = \"/a/\" }]\n[[rooms]]\nid = \"b\"\nroutes = [{ path_prefix = \"/b/\" }]\n";
    assert_eq!(parse(text).unwrap().rooms[1].routes.len(), 1);
}

#[test]
fn type_errors_name_the_field_and_the_line() {
    let e = err("[[rooms]]\nid = \"a\"\n[[rooms]]\nid = \"b\"\ncapacity = \"x\"\n");
    assert_eq!(
        e,
        "test.toml: rooms[1].capacity: invalid type: string \"x\", expected u32 (line 5, column 12)"
    );
    let e = err("listen = \"localhost\"");
    assert!(e.starts_with("test.toml: listen: "), "{e}");
    let e = err("cookie_secure = \"yes\"");
    assert!(
        e.starts_with("test.toml: cookie_secure: invalid type"),
        "{e}"
    );
    let e = err("[[rooms]]\nid = \"a\"\ntick = \"soon\"");
    assert!(
        e.starts_with("test.toml: rooms[0].tick: expected a duration"),
        "{e}"
    );
    let e = err("[[rooms]]\nid = \"Big Sale\"");
    assert!(e.starts_with("test.toml: rooms[0].id: room ids are"), "{e}");
    let e = err("[[rooms]]\ncapacity = 5");
    assert!(e.contains("missing field `id`"), "{e}");
    let e = err("log_format = \"xml\"");
    assert!(
        e.starts_with("test.toml: log_format: unknown variant `xml`"),
        "{e}"
    );
    let e = err("on_backend_error = \"maybe\"");
    assert!(
        e.starts_with("test.toml: on_backend_error: unknown variant"),
        "{e}"
    );
    let e = err("backend = \"postgres\"");
    assert!(e.starts_with("test.toml: backend: unknown variant"), "{e}");
    let e = err("max_streams_per_address = -1");
    assert!(e.starts_with("test.toml: max_streams_per_address: "), "{e}");
}

#[test]
fn unknown_keys_are_errors_everywhere() {
    let e = err("lisen = \"127.0.0.1:1\"");
    assert!(
        e.starts_with("test.toml: lisen: unknown field `lisen`"),
        "{e}"
    );
    let e = err("[[rooms]]\nid = \"a\"\ncapcity = 1");
    assert!(
        e.starts_with("test.toml: rooms[0].capcity: unknown field"),
        "{e}"
    );
    let e = err(&format!(
        "[[webhooks]]\nurl = \"https://x.example\"\nsecret = \"{SECRET_A}\"\nevent = []"
    ));
    assert!(
        e.starts_with("test.toml: webhooks[0].event: unknown field"),
        "{e}"
    );
    // A top-level key written after a table belongs to that table.
    let e = err("[[rooms]]\nid = \"a\"\nlisten = \"127.0.0.1:1\"");
    assert!(
        e.starts_with("test.toml: rooms[0].listen: unknown field"),
        "{e}"
    );
}

#[test]
fn syntax_errors_name_the_line() {
    let e = err("listen = \"127.0.0.1:8080\"\nbackend = embedded\n");
    assert!(e.starts_with("test.toml: line 2, column 11: "), "{e}");
    let e = err("[[rooms]\nid = \"a\"");
    assert!(e.starts_with("test.toml: line 1, "), "{e}");
    let e = err("listen = \"a\"\nlisten = \"b\"");
    assert!(e.starts_with("test.toml: "), "{e}");
}

#[test]
fn rooms_need_unique_ids_and_at_least_one() {
    let e = err("[[rooms]]\nid = \"a\"\n[[rooms]]\nid = \"b\"\n[[rooms]]\nid = \"a\"");
    assert_eq!(
        e,
        "test.toml: rooms[2].id: duplicate room id \"a\" (also rooms[0])"
    );
    let e = err("rooms = []");
    assert!(e.starts_with("test.toml: rooms: at least one room"), "{e}");
}

#[test]
fn backend_settings_must_agree() {
    let e = err("backend = \"redis\"");
    assert!(
        e.starts_with("test.toml: redis_url: required with backend = \"redis\""),
        "{e}"
    );
    let e = err("redis_url = \"redis://127.0.0.1\"");
    assert!(
        e.starts_with("test.toml: redis_url: set, but backend is \"embedded\""),
        "{e}"
    );
    let e = err("redis_cluster_nodes = [\"redis://a\"]");
    assert!(
        e.starts_with("test.toml: redis_cluster_nodes: set, but"),
        "{e}"
    );
    for bad in [
        "http://x",
        "redis://",
        "redis:///",
        "127.0.0.1:6379",
        "redis+unix://",
        "unix:///",
        "unix://run/redis.sock",
        "redis://a b",
        "",
    ] {
        let e = err(&format!("backend = \"redis\"\nredis_url = \"{bad}\""));
        assert!(
            e.starts_with("test.toml: redis_url: must be a Redis URL"),
            "{bad}: {e}"
        );
    }
    let e = err(
        "backend = \"redis\"\nredis_url = \"redis://a\"\nredis_cluster_nodes = [\"redis://b\", \"b:1\"]",
    );
    assert!(
        e.starts_with("test.toml: redis_cluster_nodes[1]: must be"),
        "{e}"
    );
    for good in [
        "redis://127.0.0.1:6379",
        "rediss://user:pw@host:6380/2",
        "REDIS://host",
        "redis+unix:///run/redis.sock",
        "unix:///run/redis.sock",
    ] {
        let c = parse(&format!("backend = \"redis\"\nredis_url = \"{good}\""));
        assert!(c.is_ok(), "{good}: {c:?}");
    }
}

#[test]
fn secrets_must_be_long_enough() {
    for key in ["secret", "previous_secret", "admin_token"] {
        let e = err(&format!("{key} = \"short\""));
        assert!(
            e.starts_with(&format!(
                "test.toml: {key}: must be at least 32 bytes, got 5"
            )),
            "{e}"
        );
    }
    let e = err("[[webhooks]]\nurl = \"https://x.example\"\nsecret = \"short\"");
    assert!(
        e.starts_with("test.toml: webhooks[0].secret: must be a Standard Webhooks secret"),
        "{e}"
    );
    let e = err(
        "[[webhooks]]\nurl = \"https://x.example\"\nsecret = \"whsec_c2hvcnQ=\"\n\
         previous_secret = \"whsec_!!\"",
    );
    assert!(
        e.starts_with("test.toml: webhooks[0].secret: the key after `whsec_` must be 24 to 64"),
        "{e}"
    );
    let exactly = "a".repeat(32);
    assert!(parse(&format!("secret = \"{exactly}\"")).is_ok());
}

#[test]
fn secrets_never_appear_in_errors_or_debug_output() {
    let leaky = "hunter2-but-longer-hunter2-hunter2-hunter2";
    let short = "hunter2";
    let cases = [
        format!("secret = \"{short}\""),
        format!("admin_token = \"{short}\""),
        "previous_secret = 12345678901234567890".to_owned(),
        format!("secret = {leaky}"),
        format!("secret = \"{leaky}"),
        format!("secret = \"{leaky}\\q\""),
        format!("\"admin_token\" = '{leaky}' x"),
        format!("[[webhooks]]\nurl = \"https://x.example\"\nsecret = \"{short}\""),
        format!("[[webhooks]]\nurl = \"https://x.example\"\nsecret = 1{short}"),
    ];
    for text in &cases {
        let e = err(text);
        for needle in [leaky, short, "12345678901234567890"] {
            assert!(!e.contains(needle), "{e} leaks the secret of:\n{text}");
        }
    }
    let mut c = parse(&format!(
        "secret = \"{leaky}\"\nprevious_secret = \"{leaky}\"\nadmin_token = \"{leaky}\"\n\
         backend = \"redis\"\nredis_url = \"redis://user:{leaky}@h:1/0\"\n\
         redis_cluster_nodes = [\"redis://:{leaky}@h:2\"]\n\
         [[webhooks]]\nurl = \"https://hooks.example/{leaky}?t={leaky}\"\nsecret = \"{leaky}\""
    ))
    .expect("valid");
    let shown = format!("{c:?}");
    assert!(!shown.contains("hunter2"), "{shown}");
    assert!(shown.contains("[redacted]"));
    assert!(
        shown.contains("\"redis://[redacted]@h:1/[redacted]\""),
        "{shown}"
    );
    assert!(
        shown.contains("\"https://hooks.example/[redacted]\""),
        "{shown}"
    );

    let e = c
        .apply_env(env(&[("NARABU_SECRET", short)]))
        .expect_err("short");
    assert!(!e.to_string().contains(short), "{e}");
}

#[test]
fn the_metrics_token_comes_from_the_file_or_the_environment() {
    assert!(parse("").unwrap().metrics_token.is_none());
    let mut c = parse(&format!("metrics_token = \"{SECRET_A}\"")).unwrap();
    assert_eq!(c.metrics_token.as_ref().map(Secret::expose), Some(SECRET_A));
    c.apply_env(env(&[("NARABU_METRICS_TOKEN", SECRET_B)]))
        .unwrap();
    assert_eq!(c.metrics_token.as_ref().map(Secret::expose), Some(SECRET_B));
    let e = err("metrics_token = \"short-metrics-token\"");
    assert!(
        e.starts_with("test.toml: metrics_token: must be at least 32 bytes"),
        "{e}"
    );
    assert!(!e.contains("short-metrics-token"), "{e}");
    let e = Config::default()
        .apply_env(env(&[("NARABU_METRICS_TOKEN", "short-metrics-token")]))
        .expect_err("short token");
    assert_eq!(e.field(), "NARABU_METRICS_TOKEN");
    assert!(!e.to_string().contains("short-metrics-token"), "{e}");
}

#[test]
fn apply_env_takes_secrets_and_checks_them() {
    let mut c = Config::default();
    c.apply_env(env(&[
        ("NARABU_SECRET", SECRET_A),
        ("NARABU_ADMIN_TOKEN", SECRET_B),
    ]))
    .expect("valid secrets");
    assert_eq!(c.secret.as_ref().map(Secret::expose), Some(SECRET_A));
    assert_eq!(c.admin_token.as_ref().map(Secret::expose), Some(SECRET_B));

    // The environment overrides the file; an empty variable is not set.
    let mut c = parse(&format!("secret = \"{SECRET_A}\"")).expect("valid");
    c.apply_env(env(&[
        ("NARABU_SECRET", SECRET_B),
        ("NARABU_ADMIN_TOKEN", ""),
    ]))
    .expect("valid");
    assert_eq!(c.secret.as_ref().map(Secret::expose), Some(SECRET_B));
    assert!(c.admin_token.is_none());

    let e = Config::default()
        .apply_env(env(&[("NARABU_ADMIN_TOKEN", "too-short")]))
        .expect_err("short token");
    assert_eq!(e.origin(), "environment");
    assert_eq!(e.field(), "NARABU_ADMIN_TOKEN");
    assert!(
        e.message().starts_with("must be at least 32 bytes, got 9"),
        "{e}"
    );

    let mut unchanged = Config::default();
    unchanged.apply_env(env(&[])).expect("nothing to do");
    assert!(unchanged.secret.is_none());
}

#[test]
fn redis_needs_a_shared_secret_and_previous_needs_current() {
    let mut c = parse("backend = \"redis\"\nredis_url = \"redis://h\"").expect("valid file");
    let e = c.apply_env(env(&[])).expect_err("no secret anywhere");
    assert_eq!(e.field(), "secret");
    assert!(
        e.message().starts_with("required with backend = \"redis\""),
        "{e}"
    );
    c.apply_env(env(&[("NARABU_SECRET", SECRET_A)]))
        .expect("the environment supplies it");

    let mut c = parse(&format!("previous_secret = \"{SECRET_B}\"")).expect("valid file");
    let e = c.apply_env(env(&[])).expect_err("previous alone");
    assert_eq!(e.field(), "previous_secret");
    c.apply_env(env(&[("NARABU_SECRET", SECRET_A)]))
        .expect("now paired");
}

#[test]
fn trusted_proxies_take_networks_and_addresses() {
    let e = err("trusted_proxies = [\"10.0.0.0/8\", \"proxy.internal\"]");
    assert!(
        e.starts_with("test.toml: trusted_proxies[1]: expected an IP address"),
        "{e}"
    );
    let e = err("trusted_proxies = [\"10.0.0.0/33\"]");
    assert!(e.starts_with("test.toml: trusted_proxies[0]: "), "{e}");
    let e = err("trusted_proxies = \"10.0.0.0/8\"");
    assert!(
        e.starts_with("test.toml: trusted_proxies: invalid type"),
        "{e}"
    );
}

#[test]
fn the_client_address_header_is_one_of_two() {
    assert_eq!(
        parse("").unwrap().client_ip_header,
        ClientIpHeader::XForwardedFor
    );
    let c = parse("client_ip_header = \"forwarded\"").unwrap();
    assert_eq!(c.client_ip_header, ClientIpHeader::Forwarded);
    let c = parse("client_ip_header = \"x-forwarded-for\"").unwrap();
    assert_eq!(c.client_ip_header, ClientIpHeader::XForwardedFor);
    let e = err("client_ip_header = \"x-real-ip\"");
    assert!(e.starts_with("test.toml: client_ip_header: "), "{e}");
    assert!(e.contains("forwarded"), "{e}");
}

#[test]
fn public_url_and_webhooks_are_checked() {
    for bad in [
        "queue.example.com",
        "ftp://x",
        "https://",
        "https:///x",
        "https://a b",
    ] {
        let e = err(&format!("public_url = \"{bad}\""));
        assert!(
            e.starts_with("test.toml: public_url: must be an http"),
            "{bad}: {e}"
        );
    }
    let e = err("public_url = \"https://q.example.com/?x=1\"");
    assert!(
        e.starts_with("test.toml: public_url: must not have a query"),
        "{e}"
    );
    let c = parse("public_url = \"http://q.example.com/waiting//\"").expect("a prefix");
    assert_eq!(
        c.public_url.as_deref(),
        Some("http://q.example.com/waiting")
    );

    let hook = |extra: &str| {
        format!("[[webhooks]]\nurl = \"https://h.example\"\nsecret = \"{SECRET_A}\"\n{extra}")
    };
    let e = err(&hook("queue_threshold = 0"));
    assert!(
        e.starts_with("test.toml: webhooks[0].queue_threshold: must be at least 1"),
        "{e}"
    );
    // A misspelt event would never fire: refused, naming the real ones.
    let e = err(&hook("events = [\"room.opened\", \"room.pasued\"]"));
    assert!(
        e.starts_with(
            "test.toml: webhooks[0].events[1]: unknown event \"room.pasued\"; \
             the events are room.opened, room.paused,"
        ),
        "{e}"
    );
    let e = err("[[webhooks]]\nurl = \"mailto:x@example.com\"\nsecret = \"x\"");
    assert!(
        e.starts_with("test.toml: webhooks[0].url: must be an http"),
        "{e}"
    );
    let e = err("[[webhooks]]\nurl = \"https://h.example\"");
    assert!(e.contains("missing field `secret`"), "{e}");
    let c = parse(&hook("events = [\"room.opened\"]\nqueue_threshold = 5")).expect("valid");
    assert_eq!(
        c.webhooks[0].events,
        [crate::webhooks::EventType::RoomOpened]
    );
    assert_eq!(c.webhooks[0].queue_threshold, Some(5));
}

#[test]
fn data_dir_must_not_be_empty() {
    assert_eq!(
        err("data_dir = \"\""),
        "test.toml: data_dir: must not be empty"
    );
}

#[test]
fn load_names_the_file_it_cannot_read() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let missing = dir.path().join("nope.toml");
    let e = Config::load(&missing).expect_err("missing file");
    assert_eq!(e.origin(), missing.display().to_string());
    assert!(e.message().starts_with("cannot read: "), "{e}");

    let path = dir.path().join("narabu.toml");
    std::fs::write(&path, "[[rooms]]\nid = \"sale\"\ncapacity = 5\n").expect("write");
    let c = Config::load(&path).expect("valid");
    assert_eq!(c.rooms[0].capacity, 5);

    std::fs::write(&path, [0xff_u8, 0xfe, 0x00]).expect("write");
    let e = Config::load(&path).expect_err("not UTF-8");
    assert!(e.message().starts_with("cannot read: "), "{e}");
}

#[test]
fn hostile_input_is_an_error_not_a_panic() {
    for text in [
        "\u{0}",
        "=",
        "[[rooms]]\nid = \"a\"\ncapacity = 99999999999999999999",
        "rooms = 1",
        "rooms = [1]",
        "[rooms]\nid = \"a\"",
        "webhooks = {}",
        "listen = \"[::1]:99999\"",
        "[[rooms]]\nid = \"a\"\ntick = \"18446744073709551616s\"",
        "[[rooms]]\nid = \"a\"\nopens_at = \"+99999-01-01T00:00:00Z\"",
        &"[".repeat(10_000),
    ] {
        assert!(parse(text).is_err(), "{text:?} should be refused");
    }
}

#[test]
fn line_column_counts_characters() {
    assert_eq!(line_column("", 0), (1, 1));
    assert_eq!(line_column("ab\ncd", 4), (2, 2));
    assert_eq!(line_column("é = x", 3), (1, 3));
    assert_eq!(line_column("abc", 99), (1, 4));
}

/// A new webhook event is named where operators look for the list.
#[test]
fn every_webhook_event_is_documented() {
    let example = std::fs::read_to_string(EXAMPLE).expect("the example config exists");
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operating.md"))
        .expect("the operators' guide exists");
    for e in crate::webhooks::EventType::ALL {
        assert!(
            example.contains(e.name()),
            "{} is not in {EXAMPLE}",
            e.name()
        );
        assert!(
            readme.contains(&format!("`{}`", e.name())),
            "{} is not in docs/operating.md",
            e.name()
        );
    }
}

#[test]
fn pass_keys_and_lifetimes_are_checked() {
    let c = parse("pass_algorithm = \"EdDSA\"\npass_key_file = \"/k.pem\"\n").unwrap();
    assert_eq!(c.pass_algorithm, crate::pass::PassAlgorithm::EdDSA);
    assert_eq!(c.pass_key_file.as_deref(), Some(Path::new("/k.pem")));
    assert!(err("pass_algorithm = \"RS256\"").contains("pass_algorithm"));
    assert_eq!(
        err("previous_pass_key_file = \"/old.pem\""),
        "test.toml: previous_pass_key_file: set only together with pass_key_file (a derived \
         pass key rotates with secret and previous_secret)"
    );
    assert!(err("pass_key_file = \"\"").contains("pass_key_file: must not be empty"));
    let room = |lifetime: &str| format!("[[rooms]]\nid = \"a\"\npass_lifetime = \"{lifetime}\"\n");
    assert_eq!(
        parse(&room("5m")).unwrap().rooms[0].pass_lifetime,
        std::time::Duration::from_secs(300)
    );
    assert_eq!(
        Config::default().rooms[0].pass_lifetime,
        std::time::Duration::from_secs(60)
    );
    for bad in ["0s", "999ms", "61m"] {
        assert_eq!(
            err(&room(bad)),
            format!(
                "test.toml: rooms[0].pass_lifetime: must be between 1s and 1h, got {}",
                humantime::format_duration(humantime::parse_duration(bad).unwrap())
            ),
            "{bad}"
        );
    }
}

#[test]
fn push_is_off_unless_a_push_table_turns_it_on() {
    assert_eq!(parse("").unwrap().push, PushConfig::default());
    assert!(!parse("[push]\nenabled = false\n").unwrap().push.enabled);
    let on = parse("[push]\ncontact = \"mailto:ops@example.com\"\n").unwrap();
    assert!(on.push.enabled);
    assert_eq!(on.push.contact, "mailto:ops@example.com");
    assert_eq!(on.push.vapid_key_file, None);
    assert!(!on.push.allow_insecure_endpoints);
    let with_file = parse(
        "[push]\ncontact = \"https://shop.example/contact\"\nvapid_key_file = \"/etc/narabu/vapid.pem\"\n",
    )
    .unwrap();
    assert_eq!(
        with_file.push.vapid_key_file.as_deref(),
        Some(Path::new("/etc/narabu/vapid.pem"))
    );
}

#[test]
fn push_errors_name_the_field() {
    let e = err("[push]\nenabled = true\n");
    assert!(e.contains("push.contact") && e.contains("required"), "{e}");
    let e = err("[push]\ncontact = \"ops@example.com\"\n");
    assert!(e.contains("push.contact") && e.contains("mailto:"), "{e}");
    let e = err("[push]\ncontact = \"mailto:a@b.c\"\nvapid_key_file = \"\"\n");
    assert!(e.contains("push.vapid_key_file"), "{e}");
    let e = err("[push]\ncontact = \"mailto:a@b.c\"\nvapid_key = \"x\"\n");
    assert!(e.contains("vapid_key"), "{e}");
}

#[test]
fn a_replaced_lines_report_is_kept_thirty_days_unless_said_otherwise() {
    let secret = format!("secret = \"{SECRET_A}\"\n");
    assert_eq!(
        parse(&secret).unwrap().report_keep,
        Duration::from_secs(30 * 86_400)
    );
    let off = parse(&format!("{secret}report_keep = \"0s\"\n")).unwrap();
    assert_eq!(off.report_keep, Duration::ZERO);
    let year = parse(&format!("{secret}report_keep = \"365d\"\n")).unwrap();
    assert_eq!(year.report_keep, Duration::from_secs(365 * 86_400));
    assert!(
        err(&format!("{secret}report_keep = \"4000d\"\n"))
            .contains("report_keep: must be at most 3650d")
    );
    assert!(err(&format!("{secret}report_keep = \"soon\"\n")).contains("report_keep"));
}
