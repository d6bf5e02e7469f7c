//! Tokens read from a file (`--token-file`), so that a secret never shows in `ps`,
//! in `/proc/PID/cmdline` or in `/proc/mounts`.

use crate::protocol::MAX_TOKEN_LEN;

/// The token in the file at `path`: its one line, without the line end. A missing
/// or unreadable file, an empty one, one of several lines or a token longer than the
/// protocol carries is an error that names the file (used as a clap value parser).
pub fn read_token_file(path: &str) -> Result<String, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("reading the token file {path}: {e}"))?;
    let line = text.strip_suffix('\n').unwrap_or(&text);
    let token = line.strip_suffix('\r').unwrap_or(line);
    if token.is_empty() {
        Err(format!("the token file {path} is empty"))
    } else if token.contains('\n') {
        Err(format!(
            "the token file {path} holds more than one line; the token is its only line"
        ))
    } else if token.len() > MAX_TOKEN_LEN {
        Err(format!(
            "the token in {path} is {} bytes; at most {MAX_TOKEN_LEN} are allowed",
            token.len()
        ))
    } else {
        Ok(token.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_is_the_token_and_anything_else_is_refused() {
        let dir = std::env::temp_dir().join(format!("rmemfs-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = |name: &str, body: &str| {
            let p = dir.join(name);
            std::fs::write(&p, body).unwrap();
            p.to_string_lossy().into_owned()
        };
        assert_eq!(read_token_file(&file("a", "s3cret\n")), Ok("s3cret".into()));
        assert_eq!(read_token_file(&file("b", "s3cret")), Ok("s3cret".into()));
        assert_eq!(
            read_token_file(&file("c", "s3cret\r\n")),
            Ok("s3cret".into())
        );
        for (name, body, why) in [
            ("d", "", "empty"),
            ("e", "\n", "empty"),
            ("f", "one\ntwo\n", "more than one line"),
        ] {
            let err = read_token_file(&file(name, body)).unwrap_err();
            assert!(err.contains(why), "{body:?}: {err}");
        }
        let long = "x".repeat(MAX_TOKEN_LEN + 1);
        assert!(read_token_file(&file("g", &long))
            .unwrap_err()
            .contains("at most"));
        let missing = dir.join("missing").to_string_lossy().into_owned();
        assert!(read_token_file(&missing).unwrap_err().contains("missing"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
