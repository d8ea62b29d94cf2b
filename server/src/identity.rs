//! Who a request comes from, as a guard established it ([`Identity`]): the one piece of a
//! guard's verdict a handler sees. Apart from `guard.rs` so that the handler API can carry it
//! without importing guards (which import the handler API).

/// An account a guard established for a request (a realm and a user in it), handed to the
/// handler behind the guard. Held inline, so passing one allocates nothing: each part is at
/// most [`Identity::MAX`] bytes and has no control characters (it may become a header value).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Identity {
    bytes: [u8; 2 * Identity::MAX],
    realm_len: u8,
    user_len: u8,
}

impl Identity {
    pub const MAX: usize = 64;

    /// None when a part is too long or holds a control character.
    pub fn new(realm: &str, user: &str) -> Option<Identity> {
        let fits = |s: &str| s.len() <= Identity::MAX && !s.chars().any(char::is_control);
        if !fits(realm) || !fits(user) {
            return None;
        }
        let mut bytes = [0u8; 2 * Identity::MAX];
        bytes[..realm.len()].copy_from_slice(realm.as_bytes());
        bytes[realm.len()..realm.len() + user.len()].copy_from_slice(user.as_bytes());
        Some(Identity {
            bytes,
            realm_len: realm.len() as u8,
            user_len: user.len() as u8,
        })
    }

    pub fn realm(&self) -> &str {
        let bytes = &self.bytes[..usize::from(self.realm_len)];
        // Copied from a &str whole in `new`.
        std::str::from_utf8(bytes).unwrap_or_default()
    }

    pub fn user(&self) -> &str {
        let start = usize::from(self.realm_len);
        let bytes = &self.bytes[start..start + usize::from(self.user_len)];
        std::str::from_utf8(bytes).unwrap_or_default()
    }
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity")
            .field("realm", &self.realm())
            .field("user", &self.user())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identities_hold_their_parts_and_refuse_what_cannot_be_a_header() {
        let id = Identity::new("staff", "älice").unwrap();
        assert_eq!((id.realm(), id.user()), ("staff", "älice"));
        let long = "x".repeat(Identity::MAX);
        let id = Identity::new(&long, &long).unwrap();
        assert_eq!((id.realm(), id.user()), (long.as_str(), long.as_str()));
        assert!(Identity::new("staff", &"x".repeat(Identity::MAX + 1)).is_none());
        assert!(Identity::new("staff", "a\r\nX-Evil: 1").is_none());
        assert!(Identity::new("st\0aff", "a").is_none());
    }
}
