//! The SOURCE of `mount -t fuse.rmemfs SOURCE DIR`: which memnodes, and which volume.
//!
//! ```text
//! SOURCE = NODES [ "/" VOLUME ]
//! NODES  = "embedded" | NODE *( "," NODE )
//! NODE   = HOST ":" PORT
//! HOST   = a DNS name or IPv4 address ([A-Za-z0-9.-]), or "[" IPv6 address "]"
//! PORT   = 1..65535
//! VOLUME = 1 to 64 of [A-Za-z0-9._-], not "." or ".."
//! ```
//!
//! `10.0.0.2:7070,10.0.0.3:7070/home` mounts volume `home` from two memnodes;
//! `10.0.0.2:7070` mounts scratch memory (gone when fsd exits); `embedded` and
//! `embedded/NAME` use fsd's in-process memnode. The SOURCE is also what
//! `/proc/mounts` shows as the device, so `umount SOURCE` finds the mount. Memnodes
//! keep their order: fsd numbers them by it.

use rmemfs_common::protocol::{valid_volume_name, MAX_VOLUME_NAME};
use thiserror::Error;

/// The word for fsd's embedded memnode.
pub const EMBEDDED: &str = "embedded";

/// A parsed SOURCE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// `HOST:PORT` of each memnode, in order; empty for the embedded memnode.
    pub memnodes: Vec<String>,
    pub volume: Option<String>,
}

/// Why a SOURCE was refused; the message names the part at fault.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum SourceError {
    #[error("the SOURCE is empty")]
    Empty,
    #[error("memnode {0:?} is not HOST:PORT")]
    NoPort(String),
    #[error("memnode {node:?}: the port must be a number from 1 to 65535, not {port:?}")]
    BadPort { node: String, port: String },
    #[error(
        "memnode {0:?}: a host is a name or IPv4 address of letters, digits, '.' and '-', \
         or an IPv6 address in brackets"
    )]
    BadHost(String),
    #[error("an empty memnode in the list (two commas, or a comma at an end)")]
    EmptyNode,
    #[error("memnode {0} is named twice")]
    Duplicate(String),
    #[error("{EMBEDDED:?} stands alone: it cannot be listed with other memnodes")]
    EmbeddedInList,
    #[error(
        "volume {0:?}: a volume name is 1 to {MAX_VOLUME_NAME} letters, digits, '.', '_' or \
         '-' (and not . or ..)"
    )]
    BadVolume(String),
}

impl Source {
    /// Parses a SOURCE by the grammar above.
    pub fn parse(text: &str) -> Result<Source, SourceError> {
        if text.is_empty() {
            return Err(SourceError::Empty);
        }
        // A host holds no '/', so the first one ends the list.
        let (nodes, volume) = match text.split_once('/') {
            Some((nodes, volume)) => (nodes, Some(volume)),
            None => (text, None),
        };
        let volume = volume
            .map(|v| {
                if valid_volume_name(v.as_bytes()) {
                    Ok(v.to_string())
                } else {
                    Err(SourceError::BadVolume(v.to_string()))
                }
            })
            .transpose()?;
        if nodes == EMBEDDED {
            return Ok(Source {
                memnodes: Vec::new(),
                volume,
            });
        }
        let mut memnodes: Vec<String> = Vec::new();
        for node in nodes.split(',') {
            if node == EMBEDDED {
                return Err(SourceError::EmbeddedInList);
            }
            let node = parse_node(node)?;
            if memnodes.contains(&node) {
                return Err(SourceError::Duplicate(node));
            }
            memnodes.push(node);
        }
        Ok(Source { memnodes, volume })
    }

    /// True for fsd's embedded memnode.
    pub fn is_embedded(&self) -> bool {
        self.memnodes.is_empty()
    }
}

/// One `HOST:PORT`, checked.
fn parse_node(node: &str) -> Result<String, SourceError> {
    if node.is_empty() {
        return Err(SourceError::EmptyNode);
    }
    let Some((host, port)) = node.rsplit_once(':') else {
        return Err(SourceError::NoPort(node.into()));
    };
    if !matches!(port.parse::<u16>(), Ok(p) if p != 0) || !port.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(SourceError::BadPort {
            node: node.into(),
            port: port.into(),
        });
    }
    let host_ok = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => v6.parse::<std::net::Ipv6Addr>().is_ok(),
        None => {
            !host.is_empty()
                && !host.starts_with(['-', '.'])
                && host
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
        }
    };
    if !host_ok {
        return Err(SourceError::BadHost(node.into()));
    }
    Ok(node.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_that_parse() {
        let table: &[(&str, &[&str], Option<&str>)] = &[
            ("10.0.0.2:7070", &["10.0.0.2:7070"], None),
            (
                "10.0.0.2:7070,10.0.0.3:7070/myvol",
                &["10.0.0.2:7070", "10.0.0.3:7070"],
                Some("myvol"),
            ),
            (
                "mem-a.example.org:1/v.1_x-y",
                &["mem-a.example.org:1"],
                Some("v.1_x-y"),
            ),
            ("[::1]:7070", &["[::1]:7070"], None),
            (
                "[fe80::1]:7070,host:65535/a",
                &["[fe80::1]:7070", "host:65535"],
                Some("a"),
            ),
            ("embedded", &[], None),
            ("embedded/myvol", &[], Some("myvol")),
        ];
        for &(text, nodes, volume) in table {
            let want = Source {
                memnodes: nodes.iter().map(|n| n.to_string()).collect(),
                volume: volume.map(String::from),
            };
            assert_eq!(Source::parse(text), Ok(want), "SOURCE {text}");
        }
        assert!(Source::parse("embedded").unwrap().is_embedded());
        assert!(!Source::parse("a:1").unwrap().is_embedded());
    }

    #[test]
    fn sources_that_are_refused_say_why() {
        use SourceError::*;
        let long = format!("a:1/{}", "v".repeat(MAX_VOLUME_NAME + 1));
        let table: &[(&str, SourceError)] = &[
            ("", Empty),
            ("10.0.0.2", NoPort("10.0.0.2".into())),
            (
                "10.0.0.2:",
                BadPort {
                    node: "10.0.0.2:".into(),
                    port: "".into(),
                },
            ),
            (
                "10.0.0.2:0",
                BadPort {
                    node: "10.0.0.2:0".into(),
                    port: "0".into(),
                },
            ),
            (
                "h:70000",
                BadPort {
                    node: "h:70000".into(),
                    port: "70000".into(),
                },
            ),
            (
                "h:+80",
                BadPort {
                    node: "h:+80".into(),
                    port: "+80".into(),
                },
            ),
            (":7070", BadHost(":7070".into())),
            ("bad_host:1", BadHost("bad_host:1".into())),
            ("-h:1", BadHost("-h:1".into())),
            ("::1:7070", BadHost("::1:7070".into())),
            ("[zz]:1", BadHost("[zz]:1".into())),
            ("a:1,,b:2", EmptyNode),
            ("a:1,", EmptyNode),
            ("a:1,a:1", Duplicate("a:1".into())),
            ("a:1,embedded", EmbeddedInList),
            ("a:1/", BadVolume("".into())),
            ("a:1/..", BadVolume("..".into())),
            ("embedded/bad name", BadVolume("bad name".into())),
            ("a:1/v/w", BadVolume("v/w".into())),
            (&long, BadVolume("v".repeat(MAX_VOLUME_NAME + 1))),
        ];
        for (text, want) in table {
            let got = Source::parse(text).expect_err(text);
            assert_eq!(&got, want, "SOURCE {text:?}");
            assert!(!got.to_string().is_empty());
        }
    }
}
