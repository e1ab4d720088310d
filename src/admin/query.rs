//! Reading an admin request's path segments and query: percent-decoding, bounded, with
//! every malformed input a message for a 400.

/// Query parameters one request may carry.
pub const MAX_PARAMS: usize = 32;

/// Decodes `%XX` escapes (and `+` as a space in a query) into bytes.
pub fn percent_decode(text: &str, plus_is_space: bool) -> Result<Vec<u8>, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| format!("bad percent-escape in `{text}`"))?;
                out.push(hex);
                i += 3;
            }
            b'+' if plus_is_space => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    Ok(out)
}

/// A path segment, decoded, as UTF-8.
pub fn segment(text: &str) -> Result<String, String> {
    String::from_utf8(percent_decode(text, false)?)
        .map_err(|_| format!("path segment `{text}` is not UTF-8"))
}

/// The query's `name=value` pairs, decoded, in order: at most [`MAX_PARAMS`], names UTF-8
/// and unique, empty pairs (`a=1&&b=2`) skipped.
pub fn params(query: Option<&str>) -> Result<Vec<(String, Vec<u8>)>, String> {
    let mut out: Vec<(String, Vec<u8>)> = Vec::new();
    for pair in query
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
    {
        if out.len() == MAX_PARAMS {
            return Err(format!("at most {MAX_PARAMS} query parameters"));
        }
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let name = String::from_utf8(percent_decode(name, true)?)
            .map_err(|_| format!("query parameter name `{name}` is not UTF-8"))?;
        if out.iter().any(|(n, _)| *n == name) {
            return Err(format!("query parameter `{name}` is given twice"));
        }
        out.push((name, percent_decode(value, true)?));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_and_refuses_malformed_input() {
        assert_eq!(percent_decode("a%20b+c", true).unwrap(), b"a b c");
        assert_eq!(percent_decode("a+b", false).unwrap(), b"a+b");
        assert!(percent_decode("a%2", true).is_err());
        assert!(percent_decode("a%zz", true).is_err());
        assert!(segment("%ff").is_err());
        let p = params(Some("customer=acme&&header:x-key=a%26b&flag")).unwrap();
        assert_eq!(
            p,
            [
                ("customer".to_string(), b"acme".to_vec()),
                ("header:x-key".to_string(), b"a&b".to_vec()),
                ("flag".to_string(), Vec::new()),
            ]
        );
        assert!(params(Some("a=1&a=2")).unwrap_err().contains("twice"));
        let many: Vec<String> = (0..=MAX_PARAMS).map(|i| format!("p{i}=1")).collect();
        assert!(params(Some(&many.join("&"))).is_err());
        assert!(params(None).unwrap().is_empty());
    }
}
