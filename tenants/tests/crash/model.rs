//! What the parent knows: the state that the acknowledged writes imply, checked against the
//! store after every kill.

use std::collections::BTreeMap;
use superinfer_tenants::{Auth, Tenant, TenantStore};

use super::protocol::{Line, Op};

#[derive(Clone, Debug, PartialEq)]
struct Expect {
    name: String,
    weight: f64,
    enabled: bool,
    /// The current key, when the parent saw it (not after a create or rotation that was in
    /// flight at a kill).
    key: Option<String>,
}

/// The acknowledged state of the store.
#[derive(Default)]
pub struct Model {
    tenants: BTreeMap<u32, Expect>,
    /// Keys that a rotation or deletion retired: they must never authenticate again.
    retired: Vec<String>,
    /// The store's write counter after the last verified round.
    generation: u64,
}

/// What one round did.
pub struct Round {
    pub acked: u64,
    /// The write in flight when the child was killed.
    pub pending: Option<Op>,
}

impl Model {
    /// Applies the acknowledged writes of one child's output.
    pub fn absorb(&mut self, lines: &[Line]) -> Result<Round, String> {
        let mut begun: Option<Op> = None;
        let mut acked = 0;
        for line in lines {
            match (line, begun.take()) {
                (Line::Ready, None) => {}
                (Line::Begin(op), None) => begun = Some(op.clone()),
                (Line::Err(e), _) => return Err(format!("child failed: {e}")),
                (ack, Some(op)) => {
                    self.ack(&op, ack)?;
                    acked += 1;
                }
                (line, None) => return Err(format!("{line:?} without a BEGIN")),
            }
        }
        Ok(Round {
            acked,
            pending: begun,
        })
    }

    fn ack(&mut self, op: &Op, ack: &Line) -> Result<(), String> {
        match (op, ack) {
            (
                Op::Create { name, weight },
                Line::AckCreate {
                    id,
                    name: n,
                    weight: w,
                    key,
                },
            ) if name == n && weight == w => {
                let e = Expect {
                    name: n.clone(),
                    weight: *w,
                    enabled: true,
                    key: Some(key.clone()),
                };
                if self.tenants.insert(*id, e).is_some() {
                    return Err(format!("create acknowledged id {id}, which was in use"));
                }
            }
            (Op::Rotate { id }, Line::AckRotate { id: i, key }) if id == i => {
                let e = self.tenant(*id)?;
                let old = e.key.replace(key.clone());
                self.retired.extend(old);
            }
            (op @ (Op::Patch { .. } | Op::Delete { .. }), Line::Ack) => self.apply(op, None)?,
            (op, ack) => return Err(format!("{ack:?} does not answer {op:?}")),
        }
        Ok(())
    }

    fn tenant(&mut self, id: u32) -> Result<&mut Expect, String> {
        self.tenants
            .get_mut(&id)
            .ok_or_else(|| format!("write to tenant {id}, which the model lacks"))
    }

    /// Applies a patch, delete or rotation (with its key unknown) or a create (with `new_id`).
    fn apply(&mut self, op: &Op, new_id: Option<u32>) -> Result<(), String> {
        match op {
            Op::Create { name, weight } => {
                let id = new_id.ok_or("a create needs its id")?;
                let e = Expect {
                    name: name.clone(),
                    weight: *weight,
                    enabled: true,
                    key: None,
                };
                self.tenants.insert(id, e);
            }
            Op::Patch {
                id,
                name,
                weight,
                enabled,
            } => {
                let e = self.tenant(*id)?;
                (e.name, e.weight, e.enabled) = (name.clone(), *weight, *enabled);
            }
            Op::Rotate { id } => {
                let old = self.tenant(*id)?.key.take();
                self.retired.extend(old);
            }
            Op::Delete { id } => {
                let e = self
                    .tenants
                    .remove(id)
                    .ok_or(format!("delete of unknown {id}"))?;
                self.retired.extend(e.key);
            }
        }
        Ok(())
    }

    /// Checks the reopened store against the model: consistent, holding exactly the
    /// acknowledged writes plus, at most, the one in flight. Returns whether that one landed.
    pub fn verify(&mut self, store: &TenantStore, round: &Round) -> Result<bool, String> {
        store.check().map_err(|e| e.to_string())?;
        let generation = store.generation().map_err(|e| e.to_string())?;
        // The counter is written in the same transaction as the data, so it says exactly how
        // many writes landed.
        let landed = generation
            .checked_sub(self.generation)
            .ok_or("the write counter went backwards")?;
        let applied = match landed.checked_sub(round.acked) {
            Some(0) => false,
            Some(1) if round.pending.is_some() => true,
            _ => {
                return Err(format!(
                    "{landed} writes landed, {} acknowledged, in flight: {:?}",
                    round.acked, round.pending
                ))
            }
        };
        let actual: BTreeMap<u32, Tenant> = store
            .list()
            .map_err(|e| e.to_string())?
            .into_iter()
            .map(|t| (t.id.0, t))
            .collect();
        if let (true, Some(op)) = (applied, &round.pending) {
            let new_id = actual
                .keys()
                .find(|id| !self.tenants.contains_key(id))
                .copied();
            self.apply(op, new_id)?;
        }
        self.generation = generation;
        self.compare(store, &actual)?;
        Ok(applied)
    }

    fn compare(&self, store: &TenantStore, actual: &BTreeMap<u32, Tenant>) -> Result<(), String> {
        let have: Vec<u32> = actual.keys().copied().collect();
        let want: Vec<u32> = self.tenants.keys().copied().collect();
        if have != want {
            return Err(format!(
                "store has tenants {have:?}, acknowledged writes imply {want:?}"
            ));
        }
        for (id, e) in &self.tenants {
            let t = &actual[id];
            if (&t.name, t.weight, t.enabled) != (&e.name, e.weight, e.enabled) {
                return Err(format!("tenant {id}: store has {t:?}, expected {e:?}"));
            }
            if let Some(key) = &e.key {
                match store.authenticate(key).map_err(|e| e.to_string())? {
                    Auth::Granted(t) | Auth::Disabled(t) if t.id.0 == *id => {}
                    other => return Err(format!("tenant {id}: its key gives {other:?}")),
                }
            }
        }
        for key in &self.retired {
            let auth = store.authenticate(key).map_err(|e| e.to_string())?;
            if auth != Auth::Denied {
                return Err(format!("a retired key still authenticates: {auth:?}"));
            }
        }
        Ok(())
    }
}
