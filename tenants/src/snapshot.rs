//! An in-memory copy of the registry for the request path: authenticate without touching sled.

use std::collections::HashMap;

use crate::key::{is_well_formed, KeyHash};
use crate::model::{Tenant, TenantId};

/// The answer to "who presents this key?".
#[derive(Clone, Debug, PartialEq)]
pub enum Auth<T = Tenant> {
    /// A known key of an enabled tenant.
    Granted(T),
    /// A known key of a disabled tenant: refuse with 403, naming the tenant in logs.
    Disabled(T),
    /// Unknown, rotated-out, deleted or malformed key: refuse with 401.
    Denied,
}

impl Auth {
    pub(crate) fn from_tenant(tenant: Tenant) -> Self {
        if tenant.enabled {
            Auth::Granted(tenant)
        } else {
            Auth::Disabled(tenant)
        }
    }
}

impl<T> Auth<T> {
    /// The tenant, if the key was granted.
    pub fn granted(self) -> Option<T> {
        match self {
            Auth::Granted(t) => Some(t),
            Auth::Disabled(_) | Auth::Denied => None,
        }
    }
}

/// Every tenant and key hash of the store as of one [`generation`](Snapshot::generation).
/// Built by `TenantStore::snapshot`; `Default` is the empty registry.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    generation: u64,
    tenants: Vec<Tenant>,
    by_id: HashMap<TenantId, usize>,
    /// `KeyHash` equality is constant-time, so probing this map compares in constant time.
    by_key: HashMap<KeyHash, usize>,
}

impl Snapshot {
    pub(crate) fn new(generation: u64, entries: Vec<(KeyHash, Tenant)>) -> Self {
        let mut snap = Snapshot {
            generation,
            ..Snapshot::default()
        };
        for (i, (hash, tenant)) in entries.into_iter().enumerate() {
            snap.by_id.insert(tenant.id, i);
            snap.by_key.insert(hash, i);
            snap.tenants.push(tenant);
        }
        snap
    }

    /// The store's write count when this was taken; a larger one means newer.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Every tenant, in id order.
    pub fn tenants(&self) -> &[Tenant] {
        &self.tenants
    }

    pub fn get(&self, id: TenantId) -> Option<&Tenant> {
        self.by_id.get(&id).map(|&i| &self.tenants[i])
    }

    pub fn len(&self) -> usize {
        self.tenants.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tenants.is_empty()
    }

    /// Who presents this key, as of this snapshot; see [`Auth`].
    pub fn authenticate(&self, key: &str) -> Auth<&Tenant> {
        if !is_well_formed(key) {
            return Auth::Denied;
        }
        match self.by_key.get(&KeyHash::of(key)) {
            None => Auth::Denied,
            Some(&i) if self.tenants[i].enabled => Auth::Granted(&self.tenants[i]),
            Some(&i) => Auth::Disabled(&self.tenants[i]),
        }
    }
}
