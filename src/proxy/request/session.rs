//! Session persistence on the data path: the rule's session is read from
//! the request, the pinned backend and endpoint taken when the session is
//! still good, and the token handed back with the response (see
//! [`crate::route::SessionPersistence`] for the rules).

use std::net::SocketAddr;
use std::time::{SystemTime, UNIX_EPOCH};

use http::{HeaderMap, Response};

use crate::proxy::body::ResponseBody;
use crate::route::{
    Backend, BackendSplit, BackendTarget, PathMatch, SessionPersistence, SessionToken, cookie_path,
};

/// One request's session, on a rule with `sessionPersistence`.
pub(in crate::proxy) struct Sticky<'t> {
    policy: &'t SessionPersistence,
    /// The valid session the request carried, if any.
    carried: Option<SessionToken>,
    now: u64,
}

impl<'t> Sticky<'t> {
    /// The session `headers` carry for a rule with this policy.
    pub fn read(policy: &'t SessionPersistence, headers: &HeaderMap) -> Self {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Sticky {
            policy,
            carried: policy.read(headers, now),
            now,
        }
    }

    /// The backend (with its index) the session is pinned to, and its
    /// endpoint, when the backend can still take the request: weight 0 or
    /// not ("the persistence to a single backend MUST be maintained across
    /// services, even if the weight is set to 0"), as long as it resolves
    /// to ready endpoints. The endpoint (its index in the backend's
    /// endpoints) is the session's when it is still one of them.
    pub fn pinned<'s>(
        &self,
        split: &'s BackendSplit,
    ) -> Option<(usize, &'s Backend, Option<usize>)> {
        let token = self.carried?;
        let backend = split.backends().get(token.backend)?;
        let BackendTarget::Endpoints(set) = &backend.target else {
            return None;
        };
        let endpoint = set.addrs().iter().position(|a| *a == token.endpoint);
        Some((token.backend, backend, endpoint))
    }

    /// Hand the session (new, moved or renewed) to the client with the
    /// response: the request went to `backend`'s `endpoint`, matched by
    /// `matched` (the cookie's `Path`), over TLS when `secure`.
    pub fn answer(
        &self,
        resp: &mut Response<ResponseBody>,
        backend: usize,
        endpoint: SocketAddr,
        matched: &PathMatch,
        secure: bool,
    ) {
        let token = match self.carried {
            Some(t) if t.backend == backend => SessionToken { endpoint, ..t },
            _ => self.policy.start(backend, endpoint, self.now),
        };
        if !self.policy.must_send(self.carried.as_ref(), &token) {
            return;
        }
        if let Some((name, value)) =
            self.policy
                .issue(&token, &cookie_path(matched), secure, self.now)
        {
            resp.headers_mut().append(name, value);
        }
    }
}
