//! The crate's one error enum.

use crate::id::TenantId;

/// Everything that can go wrong in the tenant registry.
///
/// `Invalid` and `NameTaken` are the caller's fault (an HTTP layer maps them to 400 and 409);
/// `NotFound` is 404; the rest are faults of the store itself (500).
#[derive(Debug, thiserror::Error)]
pub enum TenantError {
    /// An input field failed validation; `field` names it as the admin API spells it.
    #[error("invalid `{field}`: {reason}")]
    Invalid { field: &'static str, reason: String },

    /// Another tenant already has this name.
    #[error("tenant name `{0}` is already taken")]
    NameTaken(String),

    /// No tenant has this id.
    #[error("tenant {0} not found")]
    NotFound(TenantId),

    /// The tenant id counter is exhausted (4 billion tenants were created).
    #[error("tenant ids are exhausted")]
    IdsExhausted,

    /// The operating system's random source failed while making a key.
    #[error("no randomness for a new API key: {0}")]
    Entropy(String),

    /// Another process (a running server) holds the data directory.
    #[error("tenant store at {path} is in use by another process (is the server running?)")]
    Locked { path: String },

    /// [`crate::TenantStore::open_existing`] found no store to open.
    #[error("no tenant store at {path}")]
    NoStore { path: String },

    /// The data directory was written by a newer release than this one.
    #[error("tenant store schema version {found} is newer than this build supports ({supported})")]
    SchemaTooNew { found: u32, supported: u32 },

    /// A migration from an older layout could not be applied.
    #[error("migrating the tenant store from schema version {from}: {reason}")]
    Migration { from: u32, reason: String },

    /// A stored value could not be decoded, or the indexes disagree with the records.
    #[error("tenant store is corrupt: {0}")]
    Corrupt(String),

    /// A tenants file (`superinfer tenants apply`) is malformed or inconsistent; nothing
    /// was applied.
    #[error("tenants file {0}")]
    File(String),

    /// The underlying sled database failed (I/O, or a bug in sled).
    #[error("tenant store: {0}")]
    Storage(#[from] sled::Error),
}

/// An I/O error of the store's own files (its verified copy) is a storage fault, as sled's.
impl From<std::io::Error> for TenantError {
    fn from(e: std::io::Error) -> Self {
        TenantError::Storage(sled::Error::Io(e))
    }
}

/// Shorthand used throughout the crate.
pub type Result<T, E = TenantError> = std::result::Result<T, E>;

impl TenantError {
    pub(crate) fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        TenantError::Invalid {
            field,
            reason: reason.into(),
        }
    }
}
