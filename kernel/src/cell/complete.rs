//! `is_complete` for Rust cells: brackets, strings and comments, scanned by hand.
//!
//! evcxr's own kernel answers "complete" to everything. Here a cell with an open `(`, `[` or
//! `{`, an unterminated string or block comment is incomplete (the console waits for more
//! lines), a closing bracket without its opener is invalid, and everything else is complete.
//! Magic lines (`%gpumem …`), `:` commands and `!` shell lines are skipped.

/// The verdict.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Completeness {
    /// Ready to run.
    Complete,
    /// Needs more lines; the indent to suggest for the next one.
    Incomplete(String),
    /// Will not parse however much is added (a stray closing bracket).
    Invalid,
}

/// Scans a cell.
pub fn is_complete(code: &str) -> Completeness {
    let mut stack: Vec<char> = Vec::new();
    let mut in_block_comment = 0usize;
    // Inside a string: Some((is_raw, hashes)).
    let mut in_string: Option<(bool, usize)> = None;
    for line in code.lines() {
        let t = line.trim_start();
        if in_string.is_none()
            && in_block_comment == 0
            && (t.starts_with("%gpumem") || t.starts_with("%%gpumem") || t.starts_with(':') || t.starts_with('!'))
        {
            continue;
        }
        let chars: Vec<char> = line.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            let next = chars.get(i + 1).copied();
            if in_block_comment > 0 {
                if c == '*' && next == Some('/') {
                    in_block_comment -= 1;
                    i += 2;
                } else if c == '/' && next == Some('*') {
                    in_block_comment += 1;
                    i += 2;
                } else {
                    i += 1;
                }
                continue;
            }
            if let Some((raw, hashes)) = in_string {
                if !raw && c == '\\' {
                    i += 2;
                    continue;
                }
                if c == '"' && chars[i + 1..].iter().take(hashes).filter(|&&h| h == '#').count() == hashes {
                    in_string = None;
                    i += 1 + hashes;
                } else {
                    i += 1;
                }
                continue;
            }
            match c {
                '/' if next == Some('/') => break,
                '/' if next == Some('*') => {
                    in_block_comment = 1;
                    i += 2;
                }
                '"' => {
                    in_string = Some((false, 0));
                    i += 1;
                }
                'r' | 'b' | 'c' if !prev_is_ident(&chars, i) => {
                    // r"..", r#".."#, br"..", b"..", c"..", cr#".."#
                    let mut j = i + 1;
                    if c != 'r' && chars.get(j) == Some(&'r') {
                        j += 1;
                    }
                    let raw = c == 'r' || j > i + 1;
                    let mut hashes = 0;
                    while raw && chars.get(j) == Some(&'#') {
                        hashes += 1;
                        j += 1;
                    }
                    if chars.get(j) == Some(&'"') {
                        in_string = Some((raw, hashes));
                        i = j + 1;
                    } else {
                        i += 1;
                    }
                }
                '\'' => i = skip_char_literal(&chars, i),
                '(' | '[' | '{' => {
                    stack.push(c);
                    i += 1;
                }
                ')' | ']' | '}' => {
                    let want = match c {
                        ')' => '(',
                        ']' => '[',
                        _ => '{',
                    };
                    if stack.pop() != Some(want) {
                        return Completeness::Invalid;
                    }
                    i += 1;
                }
                _ => i += 1,
            }
        }
    }
    if in_string.is_some() || in_block_comment > 0 {
        return Completeness::Incomplete(String::new());
    }
    if stack.is_empty() { Completeness::Complete } else { Completeness::Incomplete("    ".repeat(stack.len())) }
}

fn prev_is_ident(chars: &[char], i: usize) -> bool {
    i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_')
}

/// Past a char literal (`'a'`, `'\n'`, `'\u{1F600}'`), or past the quote of a lifetime.
fn skip_char_literal(chars: &[char], i: usize) -> usize {
    if chars.get(i + 1) == Some(&'\\') {
        // Escaped: find the closing quote.
        let mut j = i + 2;
        while j < chars.len() && chars[j] != '\'' {
            j += 1;
        }
        return j + 1;
    }
    if chars.get(i + 2) == Some(&'\'') {
        return i + 3;
    }
    // A lifetime or label: `'a`, `'static`.
    i + 1
}

#[cfg(test)]
mod tests {
    use super::*;
    use Completeness::*;

    #[test]
    fn table() {
        let cases: &[(&str, Completeness)] = &[
            ("", Complete),
            ("1 + 1", Complete),
            ("fn f() {", Incomplete("    ".into())),
            ("fn f() {\n    let v = vec![1,", Incomplete("        ".into())),
            ("fn f() {}\n}", Invalid),
            ("let s = \"{\";", Complete),
            ("let s = \"abc", Incomplete(String::new())),
            ("let s = \"a\\\"{\";", Complete),
            ("let s = r#\"\"{\"#;", Complete),
            ("let s = r#\"{\"", Incomplete(String::new())),
            ("let c = '{';", Complete),
            ("let c = '\\'';", Complete),
            ("fn f<'a>(x: &'a str) -> &'a str { x }", Complete),
            ("// {\n1", Complete),
            ("/* { /* nested */ still comment */ 1", Complete),
            ("/* open", Incomplete(String::new())),
            ("%gpumem budget 1GiB\nlet x = (1", Incomplete("    ".into())),
            (":dep foo = { path = \"x\" }", Complete),
            (":dep foo = { path = \"x\"", Complete),
            ("let br = b\"{\";", Complete),
            ("let bar = 1; let v = [bar", Incomplete("    ".into())),
            ("(]", Invalid),
        ];
        for (src, want) in cases {
            assert_eq!(&is_complete(src), want, "{src:?}");
        }
    }
}
