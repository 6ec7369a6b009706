//! Where each key was written, to name its line in messages, and serde's errors turned into
//! one line per mistake (every unknown key and type error of a file in one run, with "did you
//! mean").

use super::*;

/// Where each key of a config file is written: `table.key` or `table[index].key` (as problems name
/// them) and its line. Read from the text line by line; a key this misses (a dotted key, one in an
/// inline table) is still named in messages, only without its line.
#[derive(Debug, Clone, Default)]
pub(super) struct Written {
    origin: String,
    /// Keys and table headers in file order.
    keys: Vec<WrittenKey>,
}

#[derive(Debug, Clone)]
pub(super) struct WrittenKey {
    /// From 1.
    line: usize,
    path: String,
    /// The table of a key; a header's own path.
    table: String,
}

impl Written {
    pub(super) fn scan(text: &str, origin: &str) -> Self {
        let mut keys = Vec::new();
        let mut table = String::new();
        let mut index: std::collections::HashMap<String, usize> = Default::default();
        for (n, l) in text.lines().enumerate() {
            let t = l.trim();
            let line = n + 1;
            if let Some(name) = t.strip_prefix("[[").and_then(|r| r.split("]]").next()) {
                let i = index.entry(name.trim().to_string()).or_insert(0);
                table = format!("{}[{}]", name.trim(), *i);
                *i += 1;
            } else if let Some(name) = t.strip_prefix('[').and_then(|r| r.split(']').next()) {
                table = name.trim().to_string();
            } else if let Some((k, _)) = t.split_once('=').filter(|_| !t.starts_with('#')) {
                let k = k.trim().trim_matches(['"', '\'']);
                let path = match table.is_empty() {
                    true => k.to_string(),
                    false => format!("{table}.{k}"),
                };
                keys.push(WrittenKey {
                    line,
                    path,
                    table: table.clone(),
                });
                continue;
            } else {
                continue;
            }
            keys.push(WrittenKey {
                line,
                path: table.clone(),
                table: table.clone(),
            });
        }
        Self {
            origin: origin.to_string(),
            keys,
        }
    }

    /// The line `path` (`spool.max-bytes`, `source[1]`) is written on.
    pub(super) fn line_of(&self, path: &str) -> Option<usize> {
        self.keys.iter().find(|k| k.path == path).map(|k| k.line)
    }

    /// The path written on line `n`: its key, else the table the line is in.
    pub(super) fn path_at(&self, n: usize) -> Option<&str> {
        let k = self.keys.iter().take_while(|k| k.line <= n).last()?;
        Some(if k.line == n {
            k.path.as_str()
        } else {
            k.table.as_str()
        })
        .filter(|p| !p.is_empty())
    }

    /// `origin:line: key: problem` for each `key: problem` (`origin: ...` when neither the key nor
    /// its table is written, e.g. a default that clashes with another key).
    pub(super) fn lines(&self, problems: Vec<String>) -> Vec<String> {
        problems
            .into_iter()
            .map(|p| {
                let path = p.strip_prefix("warning: ").unwrap_or(&p);
                let path = path.split(": ").next().unwrap_or("");
                let mut at = path.split([' ', ',']).next().unwrap_or("");
                let mut line = self.line_of(at);
                // A key left at its default is not written; its table may be.
                while line.is_none() {
                    let Some((table, _)) = at.rsplit_once('.') else {
                        break;
                    };
                    at = table;
                    line = self.line_of(at);
                }
                self.at(line, &p)
            })
            .collect()
    }

    pub(super) fn at(&self, line: Option<usize>, what: &str) -> String {
        match line {
            Some(n) => format!("{}:{n}: {what}", self.origin),
            None => format!("{}: {what}", self.origin),
        }
    }

    /// One line for a TOML/serde error: file, line, the table and key there, and the message
    /// (with the likely key for a misspelt one).
    pub(super) fn toml_error(&self, e: &toml::de::Error, text: &str) -> String {
        let msg = did_you_mean(&e.message().trim().replace('\n', " "));
        let Some(span) = e.span() else {
            return self.at(None, &msg);
        };
        let line = text[..span.start.min(text.len())].matches('\n').count() + 1;
        match self.path_at(line) {
            Some(path) => self.at(Some(line), &format!("{path}: {}", with_range(path, &msg))),
            None => self.at(Some(line), &msg),
        }
    }
}

/// Reads the top-level table `name` of the document alone (every other key skipped), so that a
/// mistake elsewhere does not hide this table's; errors keep the document's spans.
pub(super) fn read_table<T: serde::de::DeserializeOwned>(
    text: &str,
    name: &str,
) -> Result<Option<T>, toml::de::Error> {
    use serde::de::{MapAccess, Visitor};
    use std::marker::PhantomData;
    struct Document<'n, T>(&'n str, PhantomData<T>);
    impl<'de, T: Deserialize<'de>> Visitor<'de> for Document<'_, T> {
        type Value = Option<T>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a config document")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Option<T>, A::Error> {
            let mut found = None;
            while let Some(key) = map.next_key::<String>()? {
                if key == self.0 {
                    found = Some(map.next_value::<T>()?);
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok(found)
        }
    }
    serde::Deserializer::deserialize_map(toml::Deserializer::new(text), Document(name, PhantomData))
}

/// Runs `parse` on `text`, and after each error (serde stops at the first) again on a working
/// copy with the offending line blanked (line numbers stay), so that every unknown key and
/// wrongly typed value is reported in one run. An error on a table header, or a blanking that
/// breaks the TOML, ends the search.
pub(super) fn every_error<T>(
    text: &str,
    written: &Written,
    parse: impl Fn(&str) -> Result<T, toml::de::Error>,
) -> Result<T, Vec<String>> {
    let mut work = text.to_string();
    let mut errors: Vec<String> = Vec::new();
    // Keys whose line was blanked: a required one is then "missing", which the user did not write.
    let mut blanked: Vec<String> = Vec::new();
    for _ in 0..64 {
        let e = match parse(&work) {
            Ok(value) if errors.is_empty() => return Ok(value),
            Ok(_) => break,
            Err(e) => e,
        };
        if blanked
            .iter()
            .any(|k| e.message().starts_with(&format!("missing field `{k}`")))
        {
            // serde says "missing" once the table's other keys are read: nothing more to find.
            break;
        }
        let line = written.toml_error(&e, &work);
        if errors.last() == Some(&line) {
            break;
        }
        errors.push(line);
        let Some(span) = e.span() else { break };
        let at = span.start.min(work.len());
        let start = work[..at].rfind('\n').map_or(0, |i| i + 1);
        let end = work[start..].find('\n').map_or(work.len(), |i| start + i);
        let written_line = work[start..end].trim_start();
        if written_line.is_empty() || written_line.starts_with('[') {
            break;
        }
        if let Some((k, _)) = written_line.split_once('=') {
            blanked.push(k.trim().trim_matches(['"', '\'']).to_string());
        }
        work.replace_range(start..end, "");
        if work.parse::<toml::Table>().is_err() {
            break;
        }
    }
    Err(errors)
}

/// serde's "expected u8" with what the key accepts: "expected a whole number from 0 (first) to 9"
/// for a priority, "from 0 to 255" for any other u8 (a user writes numbers, not Rust types).
pub(super) fn with_range(path: &str, msg: &str) -> String {
    let key = path.rsplit('.').next().unwrap_or(path);
    let own = match key {
        "priority" => Some("0 (first) to 9"),
        "data-bits" => Some("5 to 8"),
        "stop-bits" => Some("1 to 2"),
        "jpeg-quality" => Some("1 to 100"),
        "announce-receipt-timeout" => Some("2 to 255"),
        "width" | "height" => Some("1 to 16384"),
        "sample-rate" => Some("8000 to 384000"),
        "channels" => Some("1 to 32"),
        "baud" => Some("50 to 4000000"),
        "buffers" => Some("2 to 32"),
        "bucket-ms" => Some("1 to 60000"),
        "fsync-ms" => Some("1 to 60000"),
        "worker-threads" => Some("1 to 64"),
        "max-live-clients" => Some("0 to 16"),
        "log-sync-interval" | "log-announce-interval" | "log-min-delay-req-interval" => {
            Some("-7 to 4 (log2 seconds)")
        }
        _ => None,
    };
    for (ty, range) in [
        ("u8", "0 to 255"),
        ("u16", "0 to 65535"),
        ("u32", "0 to 4294967295"),
        ("u64", "0 to 18446744073709551615"),
        ("usize", "0 to 18446744073709551615"),
        ("i8", "-128 to 127"),
        ("i64", "-9223372036854775808 to 9223372036854775807"),
    ] {
        if let Some(head) = msg.strip_suffix(&format!("expected {ty}")) {
            return format!(
                "{head}expected a whole number from {}",
                own.unwrap_or(range)
            );
        }
    }
    msg.to_string()
}

/// serde's "unknown field `max-byts`, expected one of `path`, `max-bytes`, ..." (and the same for
/// variants), with "did you mean `max-bytes`?" when one expected name is within two edits.
pub(super) fn did_you_mean(msg: &str) -> String {
    let quoted = |s: &str| -> Vec<String> {
        s.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect()
    };
    let Some(rest) = msg
        .strip_prefix("unknown field ")
        .or_else(|| msg.strip_prefix("unknown variant "))
    else {
        return msg.to_string();
    };
    let Some((got, expected)) = rest.split_once(", expected") else {
        return msg.to_string();
    };
    let Some(got) = quoted(got).into_iter().next() else {
        return msg.to_string();
    };
    let best = quoted(expected)
        .into_iter()
        .map(|name| (edit_distance(&got, &name), name))
        .filter(|(d, _)| *d <= 2)
        .min();
    match best {
        Some((_, name)) => format!("{msg}; did you mean `{name}`?"),
        None => msg.to_string(),
    }
}

/// Levenshtein distance (insertions, deletions, substitutions), on chars.
pub(super) fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}
