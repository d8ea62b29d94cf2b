//! The request paths the gate judges: a path from a header or a form made canonical, and
//! the decoded form the policy's rules are matched against.

/// `raw` (a path taken from a header or a form, not from the codec) in canonical form
/// ([`tern_server::canonical_path`]), or `None` when it has none (an encoded slash, `..`
/// above the root, a `;`...): such a path is never judged as sent, the caller refuses it.
pub(crate) fn canonical(raw: &str) -> Option<std::borrow::Cow<'_, str>> {
    tern_server::canonical_path(raw)
        .ok()
        .filter(|p| p.starts_with('/'))
}

/// The path the policy sees: a canonical path (the request's own, or one from
/// [`canonical`]) with every escape decoded, exactly the segments the router chose by and
/// the static handler opens; so `/%61dmin/`, `//admin/` or `/x/../admin/` cannot slip past a
/// rule for `/admin/`. The common path has nothing to decode and is borrowed. Bytes that are
/// not UTF-8 become U+FFFD: no rule can name them, and a separator or a dot is never among
/// them.
pub(crate) fn policy_path(canonical: &str) -> std::borrow::Cow<'_, str> {
    use std::borrow::Cow;
    match tern_server::decoded_path(canonical) {
        Cow::Borrowed(_) => Cow::Borrowed(canonical),
        Cow::Owned(bytes) => Cow::Owned(String::from_utf8_lossy(&bytes).into_owned()),
    }
}
