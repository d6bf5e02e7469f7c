//! The arithmetic of the Hello handshake: keys, nonces and proofs. Both sides use it,
//! so the two can never disagree on what is hashed.
//!
//! Neither the token nor a session's secret ever crosses the network. A connection
//! opens with the client's Hello (its client id and a fresh nonce), the memnode
//! answers with a Challenge (its own fresh nonce), and the client then proves it knows
//! the token with an HMAC-SHA-256 over both nonces and its client id
//! ([`client_proof`]); the memnode's Welcome carries the memnode's proof in turn
//! ([`server_proof`]), so fsd also knows it reached a memnode that has the token and
//! not something that only answers on its address. A new session's secret is derived
//! by both sides from the same transcript ([`session_secret`]); a later connection of
//! the session proves it knows that secret the same way ([`session_proof`]). Each
//! proof carries its own label, so one can never be replayed as another, and the
//! nonces make each connection's proofs its own.
//!
//! The key of a token is its SHA-256 ([`token_key`]): a memnode's tenants file may
//! hold that digest (`printf %s TOKEN | sha256sum`) instead of the token itself.

use crate::protocol::{SessionSecret, SESSION_SECRET_LEN};
use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest, Sha256};

/// Bytes of a nonce.
pub const NONCE_LEN: usize = 32;
/// Bytes of a proof (an HMAC-SHA-256).
pub const PROOF_LEN: usize = 32;

/// A fresh random value each side adds to a handshake.
pub type Nonce = [u8; NONCE_LEN];
/// An HMAC that shows its sender knows a key.
pub type Proof = [u8; PROOF_LEN];
/// The key a token stands for.
pub type Key = [u8; 32];

/// The key a token stands for: its SHA-256.
pub fn token_key(token: &[u8]) -> Key {
    Sha256::digest(token).into()
}

/// A new random nonce; `None` when the system has no randomness to give.
pub fn new_nonce() -> Option<Nonce> {
    let mut n = [0u8; NONCE_LEN];
    getrandom::fill(&mut n).ok()?;
    Some(n)
}

/// What one connection's handshake said, which every proof covers.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Transcript {
    pub client_id: u64,
    pub client_nonce: Nonce,
    pub server_nonce: Nonce,
}

impl std::fmt::Debug for Transcript {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transcript")
            .field("client_id", &format_args!("{:#x}", self.client_id))
            .finish_non_exhaustive()
    }
}

/// A connection between its Hello and its Prove, as the memnode keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Challenged {
    pub transcript: Transcript,
    /// The Hello said the client resumes (or joins) a session.
    pub resume: bool,
}

/// What the memnode's Welcome tells, which its proof covers too: a Welcome cannot be
/// altered on the way without the client seeing it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WelcomeFacts {
    pub node_id: u64,
    pub capacity: u64,
    pub features: u32,
    pub resumed: bool,
    pub boot: u64,
}

fn mac(key: &[u8], label: &[u8], t: &Transcript, extra: &[u8]) -> Proof {
    // HMAC takes a key of any length; this cannot fail.
    let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(key).expect("HMAC takes any key");
    m.update(label);
    m.update(&t.client_id.to_le_bytes());
    m.update(&t.client_nonce);
    m.update(&t.server_nonce);
    m.update(extra);
    m.finalize().into_bytes().into()
}

/// The client's proof that it knows the token of `key`.
pub fn client_proof(key: &Key, t: &Transcript) -> Proof {
    mac(key, b"rmemfs v2 client proof", t, &[])
}

/// The memnode's proof that it knows the token of `key`, over what its Welcome says.
pub fn server_proof(key: &Key, t: &Transcript, facts: &WelcomeFacts) -> Proof {
    let mut extra = Vec::with_capacity(29);
    extra.extend_from_slice(&facts.node_id.to_le_bytes());
    extra.extend_from_slice(&facts.capacity.to_le_bytes());
    extra.extend_from_slice(&facts.features.to_le_bytes());
    extra.push(facts.resumed as u8);
    extra.extend_from_slice(&facts.boot.to_le_bytes());
    mac(key, b"rmemfs v2 server proof", t, &extra)
}

/// The secret of a session this handshake starts: both sides derive it, neither sends it.
pub fn session_secret(key: &Key, t: &Transcript) -> SessionSecret {
    let full = mac(key, b"rmemfs v2 session secret", t, &[]);
    let mut s = [0u8; SESSION_SECRET_LEN];
    s.copy_from_slice(&full[..SESSION_SECRET_LEN]);
    if s == [0; SESSION_SECRET_LEN] {
        // All zeros means "no session"; 2^-128, but never ambiguous.
        s[0] = 1;
    }
    SessionSecret(s)
}

/// A connection's proof that it belongs to the session of `secret`.
pub fn session_proof(secret: &SessionSecret, t: &Transcript) -> Proof {
    mac(&secret.0, b"rmemfs v2 session proof", t, &[])
}

/// Compares two proofs in time that does not depend on where they differ.
pub fn proofs_match(a: &Proof, b: &Proof) -> bool {
    let mut diff = 0u8;
    for (x, y) in a.iter().zip(b) {
        diff |= std::hint::black_box(x ^ y);
    }
    diff == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transcript(id: u64) -> Transcript {
        Transcript {
            client_id: id,
            client_nonce: [1; NONCE_LEN],
            server_nonce: [2; NONCE_LEN],
        }
    }

    #[test]
    fn token_key_is_the_sha256_an_administrator_computes() {
        // printf %s abc | sha256sum
        let want = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        let got: String = token_key(b"abc")
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn each_proof_depends_on_key_label_and_every_field() {
        let k = token_key(b"the token");
        let other = token_key(b"another token");
        let t = transcript(7);
        let p = client_proof(&k, &t);
        assert_ne!(p, client_proof(&other, &t));
        assert_ne!(p, client_proof(&k, &transcript(8)));
        let mut t2 = t;
        t2.server_nonce[31] ^= 1;
        assert_ne!(p, client_proof(&k, &t2));
        let facts = WelcomeFacts {
            node_id: 1,
            capacity: 2,
            features: 3,
            resumed: false,
            boot: 0,
        };
        let s = server_proof(&k, &t, &facts);
        assert_ne!(p, s, "the client's proof is not the memnode's");
        let resumed = WelcomeFacts {
            resumed: true,
            ..facts
        };
        assert_ne!(s, server_proof(&k, &t, &resumed));
        let secret = session_secret(&k, &t);
        assert!(!secret.is_none());
        assert_ne!(secret, session_secret(&k, &t2));
        assert_ne!(session_proof(&secret, &t), session_proof(&secret, &t2));
        assert!(proofs_match(&p, &client_proof(&k, &t)));
        assert!(!proofs_match(&p, &s));
    }
}
