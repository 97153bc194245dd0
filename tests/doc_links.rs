//! Every link in README.md, BENCHMARKS.md and `docs/` leads somewhere: a
//! relative link to a file that exists, and a `#fragment` to a heading of
//! that page (as GitHub names headings: lower case, punctuation dropped,
//! spaces as hyphens, repeats numbered). A page moved or a heading renamed
//! fails here rather than in a reader's browser.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The pages whose links are checked.
fn pages() -> Vec<PathBuf> {
    let root = Path::new(ROOT);
    let mut pages = vec![root.join("README.md"), root.join("BENCHMARKS.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

/// GitHub's name for a heading.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The text without fenced code blocks (whose `#` lines are comments and
/// whose brackets are code, not links).
fn prose(text: &str) -> Vec<&str> {
    let mut fenced = false;
    text.lines()
        .filter(|line| {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect()
}

/// The anchors a page's headings make.
fn anchors(text: &str) -> HashSet<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut anchors = HashSet::new();
    for line in prose(text) {
        let Some(heading) = line.strip_prefix('#') else {
            continue;
        };
        let heading = heading.trim_start_matches('#');
        if !heading.starts_with(' ') {
            continue;
        }
        // Inline code and links keep their text in the name.
        let text: String = heading.replace('`', "");
        let base = slug(&text);
        let n = seen.entry(base.clone()).or_insert(0);
        anchors.insert(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    anchors
}

/// Each `[text](target)` of the page's prose, with its line number.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    let mut fenced = false;
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // Links inside inline code are code.
        let line: String = line
            .split('`')
            .enumerate()
            .filter(|(k, _)| k % 2 == 0)
            .map(|(_, part)| part)
            .collect::<Vec<_>>()
            .join(" ");
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            found.push((i + 1, after[..end].trim().to_owned()));
            rest = &after[end..];
        }
    }
    found
}

#[test]
fn every_link_in_the_readme_and_the_docs_leads_somewhere() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        let dir = page.parent().unwrap();
        for (line, target) in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (file, fragment) = match target.split_once('#') {
                Some((file, fragment)) => (file, Some(fragment)),
                None => (target.as_str(), None),
            };
            let path = if file.is_empty() {
                page.clone()
            } else {
                dir.join(file)
            };
            let name = page
                .strip_prefix(ROOT)
                .unwrap_or(&page)
                .display()
                .to_string();
            if !path.exists() {
                broken.push(format!("{name}:{line}: {target}: no such file"));
                continue;
            }
            if let Some(fragment) = fragment {
                let Ok(linked) = std::fs::read_to_string(&path) else {
                    broken.push(format!("{name}:{line}: {target}: not a page"));
                    continue;
                };
                if !anchors(&linked).contains(fragment) {
                    broken.push(format!("{name}:{line}: {target}: no such heading"));
                }
            }
        }
    }
    assert!(
        checked > 20,
        "only {checked} links found: the reader is broken"
    );
    assert!(
        broken.is_empty(),
        "links that lead nowhere:\n{}",
        broken.join("\n")
    );
}

#[test]
fn headings_are_named_as_github_names_them() {
    let a = anchors(
        "# The API for apps\n## Calling visitors back: Web Push\n### `GET /gate` (one gate)\n## Calling visitors back: Web Push\n```sh\n# not a heading\n```\n",
    );
    for name in [
        "the-api-for-apps",
        "calling-visitors-back-web-push",
        "get-gate-one-gate",
        "calling-visitors-back-web-push-1",
    ] {
        assert!(a.contains(name), "{name}: {a:?}");
    }
    assert!(!a.contains("not-a-heading"));
    assert_eq!(
        links("see [a](x.md#y) and `[b](not-a-link)`\n```\n[c](code)\n```\n[d](#e)"),
        vec![(1, "x.md#y".to_owned()), (5, "#e".to_owned())]
    );
}
