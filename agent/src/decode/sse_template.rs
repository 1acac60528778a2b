//! The template of a server's streamed-content writes (ebpf/src/sse.rs), from one write the
//! agent copied whole.
//!
//! vLLM and SGLang write each streamed token (or few tokens) of a completion as one HTTP
//! chunk holding one SSE event, whose JSON differs from the next one's in its content only,
//! and from another response's in its id and creation time. The template is that write cut
//! around its id and its content string, the creation time's digits left open: the kernel
//! then reports a matching write by time and size only. A write is only taken as a template when
//! nothing in it but its content is read by the agent (no finish reason, usage, error, tool
//! call or log probabilities, one choice, the first): any write that matches it says the same,
//! as its bytes outside the content are the template's.
use infertrace_common::{SSE_WRITE_MAX, SseTemplate, SseWriteBuf};
use serde_json::Value;

/// The template of `write` (the bytes of one server write), when it is one HTTP chunk holding
/// one SSE event of generated text and nothing else the agent reads.
pub fn content_template(write: &[u8]) -> Option<SseTemplate> {
    let data = one_chunk(write)?;
    let json = data.strip_prefix(b"data: ")?.strip_suffix(b"\n\n")?;
    if json.iter().any(|&b| b == b'\n' || b == b'\r') || !may_carry_text(json) {
        return None;
    }
    let chunk: Value = serde_json::from_slice(json).ok()?;
    let (key, content): (&[u8], &str) = match only_content(&chunk)? {
        Content::Delta(text) => (b"\"content\":\"", text),
        Content::Text(text) => (b"\"text\":\"", text),
    };
    let start = unique(json, key)? + key.len();
    let end = start + json[start..].iter().position(|&b| b == b'"')?;
    // Escapes would make the raw bytes differ from the text: another write will do.
    if &json[start..end] != content.as_bytes() {
        return None;
    }
    // Indices in the chunk's data, which starts with `data: `.
    let at = |i: usize| i + b"data: ".len();
    let id = string_value(json, b"\"id\":\"").filter(|id| id.end < start)?;
    let wildcards: Vec<_> = number_value(json, b"\"created\":")
        .filter(|created| id.end <= created.start && created.end <= start)
        .map(|created| created.start - id.end..created.end - id.end)
        .into_iter()
        .collect();
    let suffix_from = write.len() - (data.len() - at(end)) - 2;
    SseTemplate::new(
        &data[..at(id.start)],
        &data[at(id.end)..at(start)],
        &wildcards,
        &write[suffix_from..],
    )
}

/// Whether `json` can hold generated text: a `"content":"` or `"text":"` key followed by a
/// character (a template's text is never empty). Checked before parsing: most writes offered
/// that are not templates (a response's first and last events) have none, and parsing them
/// was most of the cost of offering them.
fn may_carry_text(json: &[u8]) -> bool {
    [&b"\"content\":\""[..], b"\"text\":\""].iter().any(|key| {
        json.windows(key.len())
            .enumerate()
            .any(|(i, w)| w == *key && json.get(i + key.len()).is_some_and(|&b| b != b'"'))
    })
}

/// What the kernel decides for `write` (ebpf/src/sse.rs runs the same matcher): the length of
/// its content when `template` matches it.
pub fn kernel_match(template: &SseTemplate, write: &[u8]) -> Option<usize> {
    if write.len() > SSE_WRITE_MAX {
        return None;
    }
    let mut buf: SseWriteBuf = [0; 2 * SSE_WRITE_MAX + 8];
    buf[..write.len()].copy_from_slice(write);
    template.matches(&buf, write.len())
}

/// The data of `write` when it is exactly one HTTP chunk: hex size, CRLF, data, CRLF.
fn one_chunk(write: &[u8]) -> Option<&[u8]> {
    let head = write.iter().position(|&b| b == b'\r')?;
    if !(1..=5).contains(&head) || write.get(head + 1) != Some(&b'\n') {
        return None;
    }
    let size = usize::from_str_radix(std::str::from_utf8(&write[..head]).ok()?, 16).ok()?;
    let data = write.get(head + 2..)?.strip_suffix(b"\r\n")?;
    (data.len() == size).then_some(data)
}

/// The generated text of a chunk that says nothing else the agent reads.
enum Content<'a> {
    /// A chat completion's `delta.content`.
    Delta(&'a str),
    /// A completion's `text`.
    Text(&'a str),
}

fn only_content(chunk: &Value) -> Option<Content<'_>> {
    let absent = |value: Option<&Value>| value.is_none_or(Value::is_null);
    if absent(chunk.get("choices")) || !absent(chunk.get("usage")) || !absent(chunk.get("error")) {
        return None;
    }
    let [choice] = chunk.get("choices")?.as_array()?.as_slice() else {
        return None;
    };
    let first = choice
        .get("index")
        .is_none_or(|index| index.as_u64() == Some(0));
    if !first || !absent(choice.get("finish_reason")) || !absent(choice.get("logprobs")) {
        return None;
    }
    match choice.get("delta") {
        Some(delta) if absent(delta.get("tool_calls")) => {
            text(delta.get("content")).map(Content::Delta)
        }
        Some(_) => None,
        None => text(choice.get("text")).map(Content::Text),
    }
}

/// A non-empty string.
fn text(value: Option<&Value>) -> Option<&str> {
    value.and_then(Value::as_str).filter(|t| !t.is_empty())
}

/// Where `key` starts in `json`, when it occurs there exactly once.
fn unique(json: &[u8], key: &[u8]) -> Option<usize> {
    let mut found = json
        .windows(key.len())
        .enumerate()
        .filter(|(_, w)| *w == key);
    let (at, _) = found.next()?;
    found.next().is_none().then_some(at)
}

/// The bytes of the string value after `key` (ending in its opening quote), when `key` occurs
/// once and the value has no escapes.
fn string_value(json: &[u8], key: &[u8]) -> Option<std::ops::Range<usize>> {
    let start = unique(json, key)? + key.len();
    let len = json[start..].iter().position(|&b| b == b'"')?;
    (!json[start..start + len].contains(&b'\\')).then_some(start..start + len)
}

/// The digits of the number after `key`, when `key` occurs once.
fn number_value(json: &[u8], key: &[u8]) -> Option<std::ops::Range<usize>> {
    let start = unique(json, key)? + key.len();
    let len = json[start..]
        .iter()
        .take_while(|b| b.is_ascii_digit())
        .count();
    (len > 0).then_some(start..start + len)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One chunk of `event` as uvicorn writes it.
    fn write(json: &str) -> Vec<u8> {
        let data = format!("data: {json}\n\n");
        format!("{:x}\r\n{data}\r\n", data.len()).into_bytes()
    }

    fn kernel_matches(template: &SseTemplate, bytes: &[u8]) -> bool {
        kernel_match(template, bytes).is_some()
    }

    fn vllm(id: &str, created: u64, content: &str) -> Vec<u8> {
        write(&format!(
            r#"{{"id":"chatcmpl-{id}","object":"chat.completion.chunk","created":{created},"model":"tiny","choices":[{{"index":0,"delta":{{"content":"{content}"}},"logprobs":null,"finish_reason":null}}]}}"#
        ))
    }

    #[test]
    fn a_content_write_matches_the_content_writes_of_any_response_and_nothing_else() {
        let template = content_template(&vllm("a1b2", 1765000000, " the")).unwrap();
        assert!(kernel_matches(&template, &vllm("a1b2", 1765000000, " cat")));
        assert!(kernel_matches(&template, &vllm("ffff", 1765000123, "s")));
        assert!(kernel_matches(
            &template,
            &vllm("ffff", 1765000123, "\\u00e9t\\u00e9")
        ));
        assert!(kernel_matches(
            &template,
            &vllm("bench-7-100", 1765000000, " cat")
        ));
        assert!(kernel_matches(
            &template,
            &vllm("a1b2", 1765000000, &"x".repeat(128))
        ));
        // Escaped quotes and backslashes stay inside the text; no text is told apart.
        assert_eq!(
            kernel_match(&template, &vllm("a", 1765000000, r#"say \"hi\" \\"#)),
            Some(13)
        );
        assert_eq!(
            kernel_match(&template, &vllm("a1b2", 1765000000, "")),
            Some(0)
        );
        // An id with an escape, a quote that ends the text early, one escaped by the text's
        // last byte, too much text.
        assert!(!kernel_matches(
            &template,
            &vllm(r#"a\"b"#, 1765000000, " cat")
        ));
        let early_end = vllm(
            "a",
            1765000000,
            r#"x","logprobs":null,"finish_reason":"stop"},{"delta":{"content":"y"#,
        );
        assert!(!kernel_matches(&template, &early_end));
        assert!(!kernel_matches(
            &template,
            &vllm("a1b2", 1765000000, r#"x\"#)
        ));
        assert!(!kernel_matches(
            &template,
            &vllm("a1b2", 1765000000, &"x".repeat(129))
        ));
        // The finish, a usage chunk, another choice, [DONE].
        let finish = r#"{"id":"chatcmpl-a1b2","object":"chat.completion.chunk","created":1765000000,"model":"tiny","choices":[{"index":0,"delta":{"content":"."},"logprobs":null,"finish_reason":"length"}]}"#;
        let usage = r#"{"id":"chatcmpl-a1b2","object":"chat.completion.chunk","created":1765000000,"model":"tiny","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}"#;
        let second = r#"{"id":"chatcmpl-a1b2","object":"chat.completion.chunk","created":1765000000,"model":"tiny","choices":[{"index":1,"delta":{"content":" cat"},"logprobs":null,"finish_reason":null}]}"#;
        for other in [finish, usage, second, "[DONE]"] {
            assert!(!kernel_matches(&template, &write(other)), "{other}");
            assert!(content_template(&write(other)).is_none(), "{other}");
        }
        // Not one whole chunk: cut, or two of them.
        let whole = vllm("a1b2", 1765000000, " cat");
        assert!(!kernel_matches(&template, &whole[..whole.len() - 1]));
        assert!(!kernel_matches(&template, &[whole.clone(), whole].concat()));
    }

    #[test]
    fn writes_without_text_are_passed_over_before_parsing() {
        assert!(may_carry_text(
            br#"{"choices":[{"delta":{"content":" the"}}]}"#
        ));
        assert!(may_carry_text(br#"{"choices":[{"text":"x","index":0}]}"#));
        let first = br#"{"choices":[{"delta":{"role":"assistant","content":""}}]}"#;
        assert!(!may_carry_text(first));
        assert!(!may_carry_text(
            br#"{"choices":[],"usage":{"total_tokens":5}}"#
        ));
        assert!(!may_carry_text(br#"{"choices":[{"delta":{"content":"#));
        assert!(content_template(&write(std::str::from_utf8(first).unwrap())).is_none());
    }

    #[test]
    fn only_writes_that_say_nothing_but_content_become_templates() {
        let cases = [
            // Log probabilities, a tool call, no content, escaped content, a completion.
            (
                r#"{"id":"x","choices":[{"index":0,"delta":{"content":"a"},"logprobs":{"content":[]},"finish_reason":null}]}"#,
                false,
            ),
            (
                r#"{"id":"x","choices":[{"index":0,"delta":{"content":"a","tool_calls":[{"index":0}]}}]}"#,
                false,
            ),
            (
                r#"{"id":"x","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#,
                false,
            ),
            (
                r#"{"id":"x","choices":[{"index":0,"delta":{"content":"\n"}}]}"#,
                false,
            ),
            (
                r#"{"id":"cmpl-1","object":"text_completion","created":1765000000,"model":"tiny","choices":[{"index":0,"text":" the","logprobs":null,"finish_reason":null,"stop_reason":null}],"usage":null}"#,
                true,
            ),
        ];
        for (json, template) in cases {
            assert_eq!(content_template(&write(json)).is_some(), template, "{json}");
        }
        // A chunk-size line that lies, or a write that is not a chunk.
        let mut wrong = vllm("a", 1, "b");
        wrong[0] = b'f';
        assert!(content_template(&wrong).is_none());
        assert!(content_template(b"data: {}\n\n").is_none());
    }
}
