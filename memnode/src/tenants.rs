//! Who may use this memnode, and how much of it: its tenants (`memnode --tenants
//! FILE`).
//!
//! A tenant is a name, the key of its token and an optional quota (bytes, volumes).
//! A client is of the tenant whose token its Hello proves; its sessions, scratch
//! memory and volumes are that tenant's, and another tenant's volume does not exist
//! for it (see `control.rs`). The plain cases stay plain: no token at all is one
//! tenant "default" that admits anyone ([`Tenants::open`]), one `--token` or
//! `--token-file` is one tenant "default" with that token ([`Tenants::single`]).
//!
//! The file is TOML, one `[[tenant]]` table per tenant:
//!
//! ```toml
//! [[tenant]]
//! name = "alice"
//! token_sha256 = "<64 hex digits>"   # printf %s TOKEN | sha256sum
//! # or: token_file = "/etc/rmemfs/alice.token"
//! quota_bytes = "64G"                # optional: a size as on command lines, or bytes
//! quota_volumes = 4                  # optional
//! ```
//!
//! A file that does not parse, names a field this memnode does not know, gives a
//! tenant no token or two, or repeats a name or a token is refused with a message
//! naming the file, the tenant and the field: a typo must never admit someone or
//! drop a quota silently.
//!
//! The books of a memory file name each session's and volume's tenant; a restart
//! whose tenants file no longer lists one keeps it as a **removed** tenant
//! ([`Tenants::add_removed`]): no token admits it, so its volumes stay in memory,
//! invisible to everyone, until the tenant is listed again.

use rmemfs_common::auth::{proofs_match, token_key, Key};
use rmemfs_common::protocol::MIN_TOKEN_LEN;
use rmemfs_common::size::{format_size, parse_size};
use serde::Deserialize;
use std::path::Path;

/// A tenant's index in its [`Tenants`]. Not stable across restarts: the books
/// name tenants, never number them.
pub type TenantId = usize;

/// The name of the one tenant of a memnode with no tenants file.
pub const DEFAULT_TENANT: &str = "default";

/// Longest tenant name.
pub const MAX_TENANT_NAME: usize = 64;

/// What a tenant may hold; `None`: no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Quota {
    pub bytes: Option<u64>,
    pub volumes: Option<u64>,
}

#[derive(Clone, PartialEq, Eq)]
struct Tenant {
    name: String,
    /// `None`: no token admits it (the open tenant admits any, a removed one none).
    key: Option<Key>,
    quota: Quota,
    /// False for a tenant only the books name (see the module docs).
    listed: bool,
}

/// Every tenant of a memnode.
#[derive(Clone, PartialEq, Eq)]
pub struct Tenants {
    list: Vec<Tenant>,
    /// No token at all: tenant 0 admits any client.
    open: bool,
}

impl std::fmt::Debug for Tenants {
    // Names and quotas only: keys stay out of logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map()
            .entries(self.list.iter().map(|t| (&t.name, t.quota)))
            .finish()
    }
}

/// One `[[tenant]]` table as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    name: String,
    token_sha256: Option<String>,
    token_file: Option<String>,
    quota_bytes: Option<toml::Value>,
    quota_volumes: Option<u64>,
}

impl Tenants {
    /// No token: one tenant, "default", and any client is of it.
    pub fn open() -> Tenants {
        Tenants {
            list: vec![Tenant {
                name: DEFAULT_TENANT.into(),
                key: None,
                quota: Quota::default(),
                listed: true,
            }],
            open: true,
        }
    }

    /// One token: one tenant, "default", with no quota.
    pub fn single(token: &[u8]) -> Tenants {
        Tenants {
            list: vec![Tenant {
                name: DEFAULT_TENANT.into(),
                key: Some(token_key(token)),
                quota: Quota::default(),
                listed: true,
            }],
            open: false,
        }
    }

    /// Reads a tenants file (see the module docs for its format).
    pub fn load(path: impl AsRef<Path>) -> Result<Tenants, String> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("tenants file {}: {e}", path.display()))?;
        Tenants::parse(&text).map_err(|e| format!("tenants file {}: {e}", path.display()))
    }

    /// The tenants of a file's text; errors name the tenant and the field (the
    /// caller adds the file).
    pub fn parse(text: &str) -> Result<Tenants, String> {
        let mut doc: toml::Table = toml::from_str(text).map_err(|e| e.to_string())?;
        let tables = match doc.remove("tenant") {
            None => Vec::new(),
            Some(toml::Value::Array(a)) => a,
            Some(_) => return Err("`tenant` must be a list of [[tenant]] tables".into()),
        };
        if let Some(key) = doc.keys().next() {
            return Err(format!(
                "unknown key `{key}`: the file holds [[tenant]] tables only"
            ));
        }
        if tables.is_empty() {
            return Err("it names no tenant ([[tenant]]): every client would be refused".into());
        }
        let mut list: Vec<Tenant> = Vec::with_capacity(tables.len());
        for (i, table) in tables.into_iter().enumerate() {
            let name = table
                .get("name")
                .and_then(toml::Value::as_str)
                .map(str::to_string)
                .ok_or_else(|| format!("tenant #{} has no name (name = \"...\")", i + 1))?;
            let t = tenant(&name, table).map_err(|e| format!("tenant {name:?}: {e}"))?;
            if list.iter().any(|o| o.name == t.name) {
                return Err(format!("tenant {name:?}: name: listed twice"));
            }
            if let Some(o) = list.iter().find(|o| o.key == t.key) {
                return Err(format!(
                    "tenant {name:?}: its token is tenant {:?}'s too: each tenant needs a token of its own",
                    o.name
                ));
            }
            list.push(t);
        }
        Ok(Tenants { list, open: false })
    }

    /// True when any client is admitted, with no token (tenant 0).
    pub fn is_open(&self) -> bool {
        self.open
    }

    /// The key of every tenant a token can admit, with its id.
    pub fn keys(&self) -> impl Iterator<Item = (TenantId, &Key)> {
        self.list
            .iter()
            .enumerate()
            .filter_map(|(i, t)| t.key.as_ref().map(|k| (i, k)))
    }

    /// The tenant `token` admits: compares its key with every tenant's, in time that
    /// does not depend on which (if any) matches. Any token admits the open tenant.
    pub fn find_by_token(&self, token: &[u8]) -> Option<TenantId> {
        if self.open {
            return Some(0);
        }
        let key = token_key(token);
        let mut found = None;
        for (id, k) in self.keys() {
            if proofs_match(k, &key) && found.is_none() {
                found = Some(id);
            }
        }
        found
    }

    pub fn name(&self, id: TenantId) -> &str {
        self.list.get(id).map_or("?", |t| t.name.as_str())
    }

    pub fn quota(&self, id: TenantId) -> Quota {
        self.list.get(id).map(|t| t.quota).unwrap_or_default()
    }

    /// False for a tenant only the books named (see [`Tenants::add_removed`]).
    pub fn is_listed(&self, id: TenantId) -> bool {
        self.list.get(id).is_some_and(|t| t.listed)
    }

    pub fn by_name(&self, name: &str) -> Option<TenantId> {
        self.list.iter().position(|t| t.name == name)
    }

    /// How many tenants there are (ids are `0..len()`).
    pub fn len(&self) -> usize {
        self.list.len()
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The tenant named `name`, added as removed (no token admits it, no quota)
    /// when it is not there: the books of a memory file name it, the tenants file
    /// does not any more.
    pub fn add_removed(&mut self, name: &str) -> TenantId {
        if let Some(id) = self.by_name(name) {
            return id;
        }
        self.list.push(Tenant {
            name: name.to_string(),
            key: None,
            quota: Quota::default(),
            listed: false,
        });
        self.list.len() - 1
    }
}

/// True for a name of 1 to [`MAX_TENANT_NAME`] letters, digits, '.', '_' or '-':
/// it shows in logs and as a metrics label as it is.
pub fn valid_tenant_name(name: &str) -> bool {
    (1..=MAX_TENANT_NAME).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// One tenant from its table.
fn tenant(name: &str, table: toml::Value) -> Result<Tenant, String> {
    let e: Entry = table
        .try_into()
        .map_err(|e| e.to_string().replace('\n', " "))?;
    if !valid_tenant_name(name) {
        return Err(format!(
            "name: a tenant name is 1 to {MAX_TENANT_NAME} letters, digits, '.', '_' or '-'"
        ));
    }
    let key = match (&e.token_sha256, &e.token_file) {
        (Some(hex), None) => parse_key(hex).map_err(|why| format!("token_sha256: {why}"))?,
        (None, Some(file)) => {
            let token = rmemfs_common::token::read_token_file(file)
                .map_err(|why| format!("token_file: {why}"))?;
            // The rule `--token` and `--token-file` follow: a short token is guessed.
            if token.len() < MIN_TOKEN_LEN {
                return Err(format!(
                    "token_file: {file} holds a token of {} bytes; a token of fewer than \
                     {MIN_TOKEN_LEN} is too easily guessed (e.g. head -c 32 /dev/urandom | base64)",
                    token.len()
                ));
            }
            token_key(token.as_bytes())
        }
        (None, None) => return Err("no token_sha256 or token_file: it would admit no one".into()),
        (Some(_), Some(_)) => {
            return Err("token_sha256 and token_file: give one token, not two".into())
        }
    };
    let bytes = match &e.quota_bytes {
        None => None,
        Some(toml::Value::String(s)) => {
            Some(parse_size(s).map_err(|why| format!("quota_bytes: {why}"))?)
        }
        Some(toml::Value::Integer(n)) => {
            Some(u64::try_from(*n).map_err(|_| format!("quota_bytes: {n} is below zero"))?)
        }
        Some(v) => {
            return Err(format!(
                "quota_bytes: a {} is not a size (\"64G\", or a number of bytes)",
                v.type_str()
            ))
        }
    };
    Ok(Tenant {
        name: e.name,
        key: Some(key),
        quota: Quota {
            bytes,
            volumes: e.quota_volumes,
        },
        listed: true,
    })
}

/// A SHA-256 in hex (as `sha256sum` prints it) as a key.
fn parse_key(hex: &str) -> Result<Key, String> {
    let hex = hex.trim();
    if hex.len() != 64 {
        return Err(format!(
            "{} characters; a SHA-256 is 64 hex digits (printf %s TOKEN | sha256sum)",
            hex.len()
        ));
    }
    let mut key = [0u8; 32];
    for (i, byte) in key.iter_mut().enumerate() {
        let pair = hex.get(2 * i..2 * i + 2).unwrap_or("");
        *byte = u8::from_str_radix(pair, 16)
            .map_err(|_| format!("{pair:?} at {} is not hex", 2 * i))?;
    }
    Ok(key)
}

/// How a quota reads in messages: `64.0 MiB`, or `no limit`.
pub fn show_quota(q: Option<u64>, size: bool) -> String {
    match q {
        None => "no limit".into(),
        Some(n) if size => format_size(n),
        Some(n) => n.to_string(),
    }
}

#[cfg(test)]
#[path = "tenants_tests.rs"]
mod tests;
