//! The commands the README and deploy/README.md show, taken out of their code blocks, indented
//! blocks and inline code, as argument lists a test can hand to the program they name (with
//! `--help` appended, clap checks every subcommand and flag and prints help instead of running).
//!
//! Documentation spells commands for people: placeholders (`<node>`, `NS/POD`, `REGISTRY`),
//! optional parts in brackets, alternatives with `|`, a `kubectl exec ... --` in front, a comment
//! after. Each is turned into a concrete, plausible value here, so what is checked is that the
//! program takes these words, not that the example runs somewhere.

/// A command found in a document: the program's name as written and its arguments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DocCommand {
    /// Where it was: `README.md:88`.
    pub at: String,
    pub args: Vec<String>,
}

/// The documents people copy commands from, under the workspace `root`: the README, the deploy
/// guide and every `docs/*.md`, sorted, each with its path relative to `root`.
pub fn documents(root: &std::path::Path) -> Vec<(String, String)> {
    let mut paths = vec![root.join("README.md"), root.join("deploy/README.md")];
    let mut docs: Vec<_> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|entry| entry.expect("docs/ entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    docs.sort();
    paths.extend(docs);
    paths
        .into_iter()
        .map(|path| {
            let name = path.strip_prefix(root).unwrap_or(&path).display().to_string();
            let text = std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("{name}: {err}"));
            (name, text)
        })
        .collect()
}

/// Every command in `text` (document `name`) whose program is one of `programs` (each matched
/// as the last path component: `target/release/lifecycle-agent` is `lifecycle-agent`).
pub fn commands(name: &str, text: &str, programs: &[&str]) -> Vec<DocCommand> {
    let mut found = Vec::new();
    let mut in_fence = false;
    let mut pending: Option<(usize, String)> = None;
    for (index, line) in text.lines().enumerate() {
        let number = index + 1;
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        let is_code = in_fence || line.starts_with("    ");
        let mut candidates: Vec<(usize, String)> = Vec::new();
        if is_code {
            let mut joined = match pending.take() {
                Some((start, before)) => (start, before + " " + line.trim()),
                None => (number, line.trim().to_owned()),
            };
            if let Some(stripped) = joined.1.strip_suffix('\\') {
                joined.1 = stripped.trim_end().to_owned();
                pending = Some(joined);
                continue;
            }
            candidates.push(joined);
        } else {
            // Inline code spans: `...`.
            candidates.extend(line.split('`').skip(1).step_by(2).map(|span| (number, span.to_owned())));
        }
        for (number, candidate) in candidates {
            if let Some(args) = parse(&candidate, programs) {
                found.push(DocCommand { at: format!("{name}:{number}"), args });
            }
        }
    }
    found
}

/// The words of `line` from one of `programs` on, made concrete; None when it names none.
fn parse(line: &str, programs: &[&str]) -> Option<Vec<String>> {
    let line = line.split(" # ").next().unwrap_or(line).trim();
    let line = line.strip_prefix("$ ").unwrap_or(line);
    let words = split_words(line);
    // The program's own name, a path ending in it (`target/release/lifecycle-agent`), or a
    // kubectl plugin's two words (`kubectl lifecycle` for `kubectl-lifecycle`); where it
    // starts the line, follows `--` (`kubectl exec ... -- lifecycle-agent`) or only
    // environment assignments. `ds/lifecycle-agent` and `helm install lifecycle-agent` are
    // objects' names, not the program.
    let runs_from =
        |start: usize| start == 0 || words[start - 1] == "--" || words[..start].iter().all(|w| w.contains('='));
    let names = |word: &str, program: &str| {
        word == program
            || (word.ends_with(&format!("/{program}"))
                && ["target/", "xtask/", "./", "/"].iter().any(|root| word.starts_with(root)))
    };
    let (start, skip) = (0..words.len()).find_map(|index| {
        if !runs_from(index) {
            return None;
        }
        let word = words[index].as_str();
        if programs.iter().any(|program| names(word, program)) {
            return Some((index, 1));
        }
        let plugin = words.get(index + 1).map(|next| format!("{word}-{next}"));
        match plugin {
            Some(plugin) if word == "kubectl" && programs.contains(&plugin.as_str()) => Some((index, 2)),
            _ => None,
        }
    })?;
    let mut args = Vec::new();
    for word in &words[start + skip..] {
        if word.starts_with('[') || word.ends_with(']') || word == "..." || word == "…" || word == "|" {
            // Optional parts and elisions are people's notation, not arguments.
            continue;
        }
        args.push(concrete(word));
    }
    Some(args)
}

/// Words split as a shell would (quotes joined, no expansion); a `<placeholder with spaces>`
/// is one word.
fn split_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut quote: Option<char> = None;
    let mut any = false;
    for c in line.chars() {
        match (quote, c) {
            (Some('>'), '>') => {
                quote = None;
                word.push('>');
            }
            (None, '<') => {
                quote = Some('>');
                word.push('<');
            }
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.push(c),
            (None, '"' | '\'') => {
                quote = Some(c);
                any = true;
            }
            (None, c) if c.is_whitespace() => {
                if any || !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                    any = false;
                }
            }
            (None, c) => word.push(c),
        }
    }
    if any || !word.is_empty() {
        words.push(word);
    }
    words
}

/// A placeholder made a value of its kind: `<node>:9890` -> `node:9890`, `NS/POD` ->
/// `ns/pod`, `a|b|c` -> `a`, `$(hostname)` -> `node`.
fn concrete(word: &str) -> String {
    let first = word.split('|').next().unwrap_or(word);
    let mut out = String::new();
    let mut rest = first;
    while let Some(open) = rest.find('<') {
        out.push_str(&rest[..open]);
        let Some(close) = rest[open..].find('>') else { break };
        out.push_str(&rest[open + 1..open + close].replace(' ', "-"));
        rest = &rest[open + close + 1..];
    }
    out.push_str(rest);
    let out = out.replace("$(hostname)", "node").replace("NS/POD", "ns/pod");
    if out == "N" {
        // A count.
        return "1".to_owned();
    }
    if !out.is_empty() && out.chars().all(|c| c.is_ascii_uppercase() || c == '_') {
        // A value written in capitals (POD, REGISTRY, F): a placeholder.
        return out.to_ascii_lowercase();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_come_out_of_every_kind_of_code_made_concrete() {
        let text = [
            "Run `lifecycle-agent status --server <node>:9890 --token-file F` there.",
            "```sh",
            "target/release/lifecycle-agent explain NS/POD     # why",
            "kubectl exec -n x ds/a -- lifecycle-agent doctor --listen 0.0.0.0:9890 \\",
            "  --health-listen 0.0.0.0:9892",
            "xtask/x.sh image [--arch amd64|arm64] [--out PATH]",
            "```",
            "    lifecycle-agent run --node-name \"$(hostname)\"",
            "Not code: lifecycle-agent nothing.",
            "    lifecycle-agent explain --node <a node> x",
            "    helm install lifecycle-agent x; kubectl exec ds/lifecycle-agent -- lifecycle-agent status -o wide|json",
            "Use `kubectl lifecycle explain NS/POD --node <node>`.",
        ]
        .join("\n");
        let text = text.as_str();
        let found = commands("DOC", text, &["lifecycle-agent"]);
        let args: Vec<Vec<&str>> = found.iter().map(|c| c.args.iter().map(String::as_str).collect()).collect();
        assert_eq!(
            args,
            vec![
                vec!["status", "--server", "node:9890", "--token-file", "f"],
                vec!["explain", "ns/pod"],
                vec!["doctor", "--listen", "0.0.0.0:9890", "--health-listen", "0.0.0.0:9892"],
                vec!["run", "--node-name", "node"],
                vec!["explain", "--node", "a-node", "x"],
                vec!["status", "-o", "wide"],
            ]
        );
        assert_eq!(found[2].at, "DOC:4", "a continued line is where it starts");
        let plugin = commands("DOC", text, &["kubectl-lifecycle"]);
        assert_eq!(plugin.len(), 1);
        assert_eq!(plugin[0].args, ["explain", "ns/pod", "--node", "node"]);
        let xtask = commands("DOC", text, &["x.sh"]);
        assert_eq!(xtask[0].args, ["image"], "optional parts left out");
    }
}
