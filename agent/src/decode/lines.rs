//! A written byte stream (a process's stdout or stderr) split into lines.

/// Longest line kept; the rest of a longer one is dropped with it (no report is this long).
const MAX_LINE: usize = 16 * 1024;

/// Splits one written byte stream into lines, each stamped with the time of the write that
/// completed it. Bytes lost in between (a gap) drop the line they belonged to.
#[derive(Debug, Default)]
pub struct LineSplitter {
    partial: Vec<u8>,
    /// The current line lost bytes, or grew past [`MAX_LINE`]: dropped at its end.
    broken: bool,
}

impl LineSplitter {
    /// The lines completed by one write, as text (invalid UTF-8 replaced).
    pub fn feed(&mut self, data: &[u8]) -> Vec<String> {
        let mut lines = Vec::new();
        let mut rest = data;
        while let Some(end) = rest.iter().position(|&b| b == b'\n') {
            self.push(&rest[..end]);
            if !std::mem::take(&mut self.broken) {
                lines.push(String::from_utf8_lossy(&self.partial).into_owned());
            }
            self.partial.clear();
            rest = &rest[end + 1..];
        }
        self.push(rest);
        lines
    }

    fn push(&mut self, bytes: &[u8]) {
        if self.partial.len() + bytes.len() > MAX_LINE {
            self.broken = true;
            self.partial.clear();
        } else {
            self.partial.extend_from_slice(bytes);
        }
    }

    /// Bytes were lost: the line they were part of is not read.
    pub fn gap(&mut self) {
        self.broken = true;
        self.partial.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_split_across_writes_and_a_gap_drops_only_its_line() {
        let mut split = LineSplitter::default();
        assert!(split.feed(b"[t] Decode ba").is_empty());
        assert_eq!(
            split.feed(b"tch\nsecond\nthi"),
            vec!["[t] Decode batch", "second"]
        );
        split.gap();
        assert!(split.feed(b"rd\n").is_empty());
        assert_eq!(split.feed(b"fourth\n"), vec!["fourth"]);
        assert!(split.feed(&vec![b'x'; MAX_LINE + 1]).is_empty());
        assert!(split.feed(b"\n").is_empty());
        assert_eq!(split.feed("fünf\n".as_bytes()), vec!["fünf"]);
    }
}
