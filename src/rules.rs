//! A room's traffic rules: which requests the gate lets through without a
//! ticket (`bypass`: health checks, static assets, a partner's API),
//! refuses outright (`block`: a known-bad network), sends to the line
//! (`queue`, what happens to every request no rule matches) or to a line
//! that never admits anyone without telling it so (`shadow`: a network
//! that should not learn it was caught, as `http::shadow` serves it).
//!
//! A [`Rule`] is what an operator writes, in a `[[rooms.rules]]` table or
//! in the admin API's room body; the engine keeps a room's rules with its
//! other settings for the backends to store, and knows nothing of what
//! they mean. [`validate`] checks them once, naming the rule and field of
//! whatever is wrong; [`RuleSet::compile`] turns them into the matcher the
//! gate asks on every check ([`RuleSet::first_match`]), a pure function of
//! a [`RequestView`] of borrowed strings: nothing is allocated per check.
//!
//! Within a rule every condition given must hold (and a condition listing
//! several values holds when one of them does); rules are tried in order
//! and the first that matches decides.

use std::net::IpAddr;
use std::sync::Arc;

use axum::http::{HeaderMap, HeaderName, header};
use globset::{GlobBuilder, GlobSet, GlobSetBuilder};
use ipnet::IpNet;
use serde::{Deserialize, Serialize};

#[cfg(test)]
mod tests;

/// The most rules a room may have: each is tried on every gate check until
/// one matches.
pub(crate) const MAX_RULES: usize = 64;
/// The most values one condition may list.
pub(crate) const MAX_VALUES: usize = 64;
/// The longest pattern, name or value in a condition.
const MAX_LEN: usize = 1024;

/// What the gate does with a request a rule matches.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Through without a ticket; not counted in the line.
    Bypass,
    /// The line, as if no rule had matched.
    #[default]
    Queue,
    /// `403`, whoever asks.
    Block,
    /// A real-looking ticket in a line that never admits anyone: the gate
    /// never lets the request through, and its joins never take a place
    /// in the real line. Judged at the join too, so only on what a join
    /// carries (no path or method).
    Shadow,
}

impl Action {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Bypass => "bypass",
            Self::Queue => "queue",
            Self::Block => "block",
            Self::Shadow => "shadow",
        }
    }
}

/// A header or cookie a request must carry: by name, and with `value`
/// exactly that value.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Named {
    pub name: String,
    #[serde(default)]
    pub value: Option<String>,
}

/// One rule as an operator writes it. Every field is stored with the room
/// (no field is left out when written, so the backends' compact encoding
/// reads it back whole); an empty list is a condition not asked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// What `/metrics` and the admin room view call the rule (its index
    /// when it has none): 1 to 64 characters of a-z, 0-9, `-` and `_`.
    #[serde(default)]
    #[schema(example = "health-checks")]
    pub name: Option<String>,
    pub action: Action,
    /// Path prefixes (`/static/`), of the path the visitor asked for.
    #[serde(default)]
    #[schema(example = json!(["/static/"]))]
    pub path_prefix: Vec<String>,
    /// Path globs: `*` and `?` within one segment, `**` across segments
    /// (`/products/*/reviews`, `/blog/**`).
    #[serde(default)]
    #[schema(example = json!(["/blog/**"]))]
    pub path: Vec<String>,
    /// Methods, as sent (`GET`, `HEAD`).
    #[serde(default)]
    pub method: Vec<String>,
    /// Hosts (`shop.example.com`), or every subdomain (`*.example.com`),
    /// without a port; compared without regard to case.
    #[serde(default)]
    pub host: Vec<String>,
    /// Client networks (`203.0.113.0/24`, `2001:db8::/32`; an address
    /// alone is its own network), of the client address as
    /// `trusted_proxies` and `client_ip_header` determine it.
    #[serde(default)]
    #[schema(value_type = Vec<String>, example = json!(["203.0.113.0/24"]))]
    pub network: Vec<IpNet>,
    /// A file of more client networks, one a line (`#` starts a comment),
    /// read on each instance from its own disk: re-read when it changes
    /// (within a few seconds, or at once on `SIGHUP`), without a restart.
    /// A file that no longer reads keeps the list read before.
    #[serde(default)]
    #[schema(example = "/etc/narabu/scrapers.txt")]
    pub network_file: Option<String>,
    /// Headers the request carries (any value, or the one given).
    #[serde(default)]
    pub header: Vec<Named>,
    /// Cookies the request carries (any value, or the one given).
    #[serde(default)]
    pub cookie: Vec<Named>,
    /// Substrings of the `User-Agent`, compared without regard to ASCII
    /// case (`Googlebot`). Anyone can send any user agent: pair these
    /// with `network` for anything that matters.
    #[serde(default)]
    #[schema(example = json!(["Googlebot"]))]
    pub user_agent: Vec<String>,
}

impl Rule {
    /// A rule with no conditions (it matches every request).
    #[cfg(test)]
    pub(crate) fn new(action: Action) -> Self {
        Self {
            name: None,
            action,
            path_prefix: Vec::new(),
            path: Vec::new(),
            method: Vec::new(),
            host: Vec::new(),
            network: Vec::new(),
            network_file: None,
            header: Vec::new(),
            cookie: Vec::new(),
            user_agent: Vec::new(),
        }
    }

    /// The rule's label: its name, or its index.
    pub(crate) fn label(&self, index: usize) -> String {
        self.name.clone().unwrap_or_else(|| index.to_string())
    }
}

/// What is wrong with a room's rules: the field, as
/// `rules[2].network[0]`, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RuleError {
    pub field: String,
    pub message: String,
}

fn error(field: String, message: impl Into<String>) -> RuleError {
    RuleError {
        field,
        message: message.into(),
    }
}

/// Checks a room's rules, naming the first field that is wrong
/// (`rules[1].path[0]`).
pub(crate) fn validate(rules: &[Rule]) -> Result<(), RuleError> {
    if rules.len() > MAX_RULES {
        return Err(error(
            "rules".into(),
            format!("at most {MAX_RULES} rules, not {}", rules.len()),
        ));
    }
    for (i, rule) in rules.iter().enumerate() {
        let at = |key: &str| format!("rules[{i}].{key}");
        let each = |key: &str, j: usize| format!("rules[{i}].{key}[{j}]");
        if let Some(name) = &rule.name {
            let ok = (1..=64).contains(&name.len())
                && name.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_'
                });
            if !ok {
                return Err(error(
                    at("name"),
                    "1 to 64 characters of a-z, 0-9, '-' and '_'",
                ));
            }
            if rules[..i].iter().any(|r| r.name.as_ref() == Some(name)) {
                return Err(error(at("name"), format!("{name:?} names two rules")));
            }
        }
        for (key, len) in [
            ("path_prefix", rule.path_prefix.len()),
            ("path", rule.path.len()),
            ("method", rule.method.len()),
            ("host", rule.host.len()),
            ("network", rule.network.len()),
            ("header", rule.header.len()),
            ("cookie", rule.cookie.len()),
            ("user_agent", rule.user_agent.len()),
        ] {
            if len > MAX_VALUES {
                return Err(error(
                    at(key),
                    format!("at most {MAX_VALUES} values, not {len}"),
                ));
            }
        }
        if rule.action == Action::Shadow {
            for (key, len) in [
                ("path_prefix", rule.path_prefix.len()),
                ("path", rule.path.len()),
                ("method", rule.method.len()),
            ] {
                if len > 0 {
                    return Err(error(
                        at(key),
                        "a shadow rule is judged at the join too, which asks for no page of \
                         the site: match on network, host, header, cookie or user_agent",
                    ));
                }
            }
        }
        for (j, p) in rule.path_prefix.iter().enumerate() {
            check_path(each("path_prefix", j), p)?;
        }
        for (j, p) in rule.path.iter().enumerate() {
            check_path(each("path", j), p)?;
            glob(p).map_err(|e| error(each("path", j), format!("not a glob: {}", e.kind())))?;
        }
        for (j, m) in rule.method.iter().enumerate() {
            if m.is_empty() || m.len() > 32 || !m.bytes().all(|b| b.is_ascii_uppercase()) {
                return Err(error(
                    each("method", j),
                    "a method in capitals, as sent (GET, POST)",
                ));
            }
        }
        if let Some(path) = &rule.network_file
            && (path.is_empty() || path.len() > 4096 || path.contains('\0'))
        {
            return Err(error(at("network_file"), "a file's path"));
        }
        for (j, h) in rule.host.iter().enumerate() {
            if !is_host_pattern(h) {
                return Err(error(
                    each("host", j),
                    "a host name in lower case without a port (shop.example.com), or *. and a domain",
                ));
            }
        }
        for (j, h) in rule.header.iter().enumerate() {
            let field = each("header", j);
            if HeaderName::from_bytes(h.name.as_bytes()).is_err()
                || h.name.bytes().any(|b| b.is_ascii_uppercase())
            {
                return Err(error(
                    format!("{field}.name"),
                    "a header name in lower case",
                ));
            }
            check_value(format!("{field}.value"), h.value.as_deref())?;
        }
        for (j, c) in rule.cookie.iter().enumerate() {
            let field = each("cookie", j);
            let token = |b: u8| b.is_ascii_graphic() && !b"()<>@,;:\\\"/[]?={}".contains(&b);
            if c.name.is_empty() || c.name.len() > MAX_LEN || !c.name.bytes().all(token) {
                return Err(error(format!("{field}.name"), "a cookie name"));
            }
            check_value(format!("{field}.value"), c.value.as_deref())?;
        }
        for (j, ua) in rule.user_agent.iter().enumerate() {
            if ua.is_empty() || ua.len() > MAX_LEN || !ua.bytes().all(|b| (0x20..0x7f).contains(&b))
            {
                return Err(error(
                    each("user_agent", j),
                    format!("1 to {MAX_LEN} printable ASCII characters"),
                ));
            }
        }
    }
    Ok(())
}

/// Checks that every rule's `network_file` reads as a list of networks,
/// naming the rule and the file's line that does not. Reads the files:
/// for the configuration at start and for an operator's change.
pub(crate) fn check_files(rules: &[Rule]) -> Result<(), RuleError> {
    for (i, rule) in rules.iter().enumerate() {
        if let Some(path) = &rule.network_file {
            read_networks(path).map_err(|e| error(format!("rules[{i}].network_file"), e))?;
        }
    }
    Ok(())
}

/// The most networks a file may list.
pub(crate) const MAX_FILE_NETWORKS: usize = 1_000_000;

/// A list of networks that does not read: the line (from 1), and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ListError {
    pub line: usize,
    pub message: String,
}

/// Networks one a line (`203.0.113.0/24`, `2001:db8::/32`, or an address
/// alone); blank lines and everything from a `#` are ignored.
pub(crate) fn parse_networks(text: &str) -> Result<Vec<IpNet>, ListError> {
    let mut nets = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let entry = line.split('#').next().unwrap_or_default().trim();
        if entry.is_empty() {
            continue;
        }
        let net = entry
            .parse::<IpNet>()
            .or_else(|_| entry.parse::<IpAddr>().map(IpNet::from))
            // The line itself is not repeated: the path may name a file
            // that was never meant to be a list (a key), and the message
            // goes to the log and to whoever changed the rule.
            .map_err(|_| ListError {
                line: i + 1,
                message: "not a network (203.0.113.0/24, 2001:db8::/32) or an address".into(),
            })?;
        if nets.len() == MAX_FILE_NETWORKS {
            return Err(ListError {
                line: i + 1,
                message: format!("more than {MAX_FILE_NETWORKS} networks"),
            });
        }
        nets.push(net);
    }
    Ok(nets)
}

/// A file of networks ([`parse_networks`]), or what is wrong with it,
/// naming the file (and the line).
pub(crate) fn read_networks(path: &str) -> Result<Vec<IpNet>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    parse_networks(&text).map_err(|e| format!("{path}: line {}: {}", e.line, e.message))
}

/// Networks to test an address against: merged where they overlap or
/// touch, and sorted, so a lookup is a binary search however long the
/// list (a file may hold many).
#[derive(Clone, Debug, Default)]
pub(crate) struct Networks(Vec<IpNet>);

impl Networks {
    pub(crate) fn new(nets: &[IpNet]) -> Self {
        let mut merged = IpNet::aggregate(&nets.to_vec());
        // Disjoint once merged: by first address, every v4 before every v6.
        merged.sort_by_key(IpNet::network);
        Self(merged)
    }

    /// An IPv4 client reached over IPv6 (`::ffff:203.0.113.5`) is in the
    /// IPv4 networks it belongs to.
    pub(crate) fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        let after = self.0.partition_point(|n| n.network() <= ip);
        after > 0 && self.0[after - 1].contains(&ip)
    }
}

/// `shop.example.com`, or `*.` and a domain: lower case, no port.
pub(crate) fn is_host_pattern(h: &str) -> bool {
    let name = h.strip_prefix("*.").unwrap_or(h);
    !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

fn check_path(field: String, p: &str) -> Result<(), RuleError> {
    if !p.starts_with('/') || p.len() > MAX_LEN {
        return Err(error(
            field,
            format!("a path starting with '/', at most {MAX_LEN} characters"),
        ));
    }
    Ok(())
}

fn check_value(field: String, v: Option<&str>) -> Result<(), RuleError> {
    match v {
        Some(v) if v.len() > MAX_LEN || !v.bytes().all(|b| (0x20..0x7f).contains(&b)) => {
            Err(error(
                field,
                format!("at most {MAX_LEN} printable ASCII characters"),
            ))
        }
        _ => Ok(()),
    }
}

fn glob(p: &str) -> Result<globset::Glob, globset::Error> {
    GlobBuilder::new(p)
        .literal_separator(true)
        .backslash_escape(true)
        .build()
}

/// A request as the rules see it: what the visitor asked the proxy for,
/// all borrowed from the gate check.
#[derive(Clone, Copy, Debug)]
pub struct RequestView<'a> {
    /// The path the visitor asked for, without its query.
    pub path: Option<&'a str>,
    pub method: Option<&'a str>,
    /// Without its port.
    pub host: Option<&'a str>,
    pub client: Option<IpAddr>,
    /// The check's headers: the visitor's own, passed on by the proxy.
    pub headers: &'a HeaderMap,
}

impl<'a> RequestView<'a> {
    /// What the proxy says the visitor asked for: the path from
    /// `X-Original-URI` (nginx) or `X-Forwarded-Uri` (Caddy, Traefik),
    /// the method from `X-Forwarded-Method`, the host from
    /// `X-Forwarded-Host` or else `Host`. The proxy must set each of
    /// them itself, since a visitor could send any of them.
    pub fn from_proxy(headers: &'a HeaderMap, client: Option<IpAddr>) -> Self {
        let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        let path = text("x-original-uri")
            .or_else(|| text("x-forwarded-uri"))
            .map(|uri| uri.split(['?', '#']).next().unwrap_or(uri));
        let host = text("x-forwarded-host")
            .map(|h| h.split(',').next().unwrap_or(h).trim())
            .or_else(|| headers.get(header::HOST).and_then(|v| v.to_str().ok()))
            .map(without_port);
        Self {
            path,
            method: text("x-forwarded-method"),
            host,
            client,
            headers,
        }
    }
}

impl<'a> RequestView<'a> {
    /// A join as the rules see it: no page of the site (no path, no
    /// method), the host it was sent to, the client as `trusted_proxies`
    /// and `client_ip_header` determine it.
    pub(crate) fn of_join(headers: &'a HeaderMap, client: IpAddr) -> Self {
        Self {
            path: None,
            method: None,
            host: headers
                .get(header::HOST)
                .and_then(|v| v.to_str().ok())
                .map(without_port),
            client: Some(client),
            headers,
        }
    }
}

/// `example.com:8000` → `example.com`; `[::1]:80` → `::1`.
pub(crate) fn without_port(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

/// One rule, ready to be asked.
#[derive(Debug)]
struct Compiled {
    action: Action,
    path_prefix: Vec<Box<str>>,
    path: Option<GlobSet>,
    method: Vec<Box<str>>,
    host: Vec<Box<str>>,
    /// `None`: the rule asks nothing of the client.
    network: Option<Networks>,
    header: Vec<(HeaderName, Option<Box<str>>)>,
    cookie: Vec<(Box<str>, Option<Box<str>>)>,
    user_agent: Vec<Box<[u8]>>,
}

/// A room's rules, compiled.
#[derive(Debug, Default)]
pub struct RuleSet {
    rules: Vec<Compiled>,
    needs_client: bool,
}

impl RuleSet {
    /// Compiles rules [`validate`] accepted; `None` for any it would not.
    /// A rule's `network_file` adds nothing here: see
    /// [`Self::compile_with`].
    pub fn compile(rules: &[Rule]) -> Option<Self> {
        Self::compile_with(rules, |_| None)
    }

    /// Compiles rules, with the networks of each `network_file` as
    /// `files` has them (`None`: none, so the rule's file adds no
    /// network).
    pub(crate) fn compile_with(
        rules: &[Rule],
        files: impl Fn(&str) -> Option<Arc<[IpNet]>>,
    ) -> Option<Self> {
        validate(rules).ok()?;
        let mut set = Self::default();
        for r in rules {
            let path = if r.path.is_empty() {
                None
            } else {
                let mut b = GlobSetBuilder::new();
                for p in &r.path {
                    b.add(glob(p).ok()?);
                }
                Some(b.build().ok()?)
            };
            let network = if r.network.is_empty() && r.network_file.is_none() {
                None
            } else {
                let mut nets = r.network.clone();
                if let Some(listed) = r.network_file.as_deref().and_then(&files) {
                    nets.extend_from_slice(&listed);
                }
                Some(Networks::new(&nets))
            };
            set.needs_client |= network.is_some();
            set.rules.push(Compiled {
                action: r.action,
                path_prefix: r.path_prefix.iter().map(|s| s.as_str().into()).collect(),
                path,
                method: r.method.iter().map(|s| s.as_str().into()).collect(),
                host: r.host.iter().map(|s| s.as_str().into()).collect(),
                network,
                header: r
                    .header
                    .iter()
                    .map(|h| {
                        let name = HeaderName::from_bytes(h.name.as_bytes()).ok()?;
                        Some((name, h.value.as_deref().map(Into::into)))
                    })
                    .collect::<Option<_>>()?,
                cookie: r
                    .cookie
                    .iter()
                    .map(|c| (c.name.as_str().into(), c.value.as_deref().map(Into::into)))
                    .collect(),
                user_agent: r
                    .user_agent
                    .iter()
                    .map(|s| s.to_ascii_lowercase().into_bytes().into())
                    .collect(),
            });
        }
        Some(set)
    }

    /// Whether some rule asks for the client's address (which costs the
    /// gate a walk through the forwarded headers to find).
    pub(crate) fn needs_client(&self) -> bool {
        self.needs_client
    }

    /// The first rule that matches, and its action.
    pub fn first_match(&self, request: &RequestView<'_>) -> Option<(usize, Action)> {
        self.rules
            .iter()
            .position(|r| r.matches(request))
            .map(|i| (i, self.rules[i].action))
    }
}

impl Compiled {
    fn matches(&self, q: &RequestView<'_>) -> bool {
        fn any<T>(values: &[T], mut hit: impl FnMut(&T) -> bool) -> bool {
            values.is_empty() || values.iter().any(&mut hit)
        }
        if !(self.path_prefix.is_empty() && self.path.is_none()) {
            let Some(path) = q.path else { return false };
            if !any(&self.path_prefix, |p| path.starts_with(&**p)) {
                return false;
            }
            if let Some(globs) = &self.path
                && !globs.is_match(path)
            {
                return false;
            }
        }
        if !self.method.is_empty() && !q.method.is_some_and(|m| any(&self.method, |x| **x == *m)) {
            return false;
        }
        if !self.host.is_empty()
            && !q
                .host
                .is_some_and(|h| any(&self.host, |x| host_matches(x, h)))
        {
            return false;
        }
        if let Some(networks) = &self.network
            && !q.client.is_some_and(|ip| networks.contains(ip))
        {
            return false;
        }
        if !any(&self.header, |(name, value)| {
            q.headers.get_all(name).iter().any(|v| match value {
                None => true,
                Some(want) => v.as_bytes() == want.as_bytes(),
            })
        }) {
            return false;
        }
        if !any(&self.cookie, |(name, value)| {
            cookie(q.headers, name).is_some_and(|v| value.as_deref().is_none_or(|want| v == want))
        }) {
            return false;
        }
        if !self.user_agent.is_empty() {
            let ua = q
                .headers
                .get(header::USER_AGENT)
                .map_or(&[][..], |v| v.as_bytes());
            if !any(&self.user_agent, |needle| {
                contains_ignoring_case(ua, needle)
            }) {
                return false;
            }
        }
        true
    }
}

/// A host against `shop.example.com` or `*.example.com` (any subdomain,
/// not the domain itself).
pub(crate) fn host_matches(pattern: &str, host: &str) -> bool {
    match pattern.strip_prefix("*.") {
        Some(domain) => {
            host.len() > domain.len() + 1
                && host.as_bytes()[host.len() - domain.len() - 1] == b'.'
                && host[host.len() - domain.len()..].eq_ignore_ascii_case(domain)
        }
        None => host.eq_ignore_ascii_case(pattern),
    }
}

/// A cookie's value, from any `Cookie` header.
fn cookie<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|pair| {
            let (k, v) = pair.trim().split_once('=')?;
            (k == name).then_some(v)
        })
}

/// `needle` is already in lower case.
fn contains_ignoring_case(haystack: &[u8], needle: &[u8]) -> bool {
    needle.len() <= haystack.len()
        && haystack
            .windows(needle.len())
            .any(|w| w.eq_ignore_ascii_case(needle))
}
