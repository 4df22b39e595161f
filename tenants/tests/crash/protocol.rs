//! The lines the child prints, one per event, each written whole and flushed:
//!
//! ```text
//! READY                                   store opened
//! BEGIN create <name> <weight>            about to call create
//! ACK create <id> <name> <weight> <key>   create returned Ok
//! BEGIN patch <id> <name> <weight> <enabled>
//! ACK patch <id>
//! BEGIN rotate <id>
//! ACK rotate <id> <key>
//! BEGIN delete <id>
//! ACK delete <id>
//! ERR <message>                           an admin write failed: the test fails
//! ```
//!
//! An `ACK` is printed only after the store call returned, so every `ACK` the parent read is a
//! write the store acknowledged; the one `BEGIN` without an `ACK` (if any) was in flight when
//! the child was killed and may or may not have happened.

#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    Create {
        name: String,
        weight: f64,
    },
    Patch {
        id: u32,
        name: String,
        weight: f64,
        enabled: bool,
    },
    Rotate {
        id: u32,
    },
    Delete {
        id: u32,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub enum Line {
    Ready,
    Begin(Op),
    AckCreate {
        id: u32,
        name: String,
        weight: f64,
        key: String,
    },
    AckRotate {
        id: u32,
        key: String,
    },
    Ack,
    Err(String),
}

impl Op {
    pub fn begin_line(&self) -> String {
        match self {
            Op::Create { name, weight } => format!("BEGIN create {name} {weight}"),
            Op::Patch {
                id,
                name,
                weight,
                enabled,
            } => {
                format!("BEGIN patch {id} {name} {weight} {enabled}")
            }
            Op::Rotate { id } => format!("BEGIN rotate {id}"),
            Op::Delete { id } => format!("BEGIN delete {id}"),
        }
    }
}

/// Parses one complete line; `None` for anything else (the test harness's own output).
pub fn parse(line: &str) -> Option<Line> {
    let w: Vec<&str> = line.split(' ').collect();
    let num = |i: usize| w.get(i)?.parse::<u32>().ok();
    let float = |i: usize| w.get(i)?.parse::<f64>().ok();
    let text = |i: usize| w.get(i).map(|s| s.to_string());
    Some(match (*w.first()?, w.get(1).copied()) {
        ("READY", _) => Line::Ready,
        ("ERR", _) => Line::Err(line.to_string()),
        ("BEGIN", Some("create")) => Line::Begin(Op::Create {
            name: text(2)?,
            weight: float(3)?,
        }),
        ("BEGIN", Some("patch")) => Line::Begin(Op::Patch {
            id: num(2)?,
            name: text(3)?,
            weight: float(4)?,
            enabled: w.get(5)?.parse().ok()?,
        }),
        ("BEGIN", Some("rotate")) => Line::Begin(Op::Rotate { id: num(2)? }),
        ("BEGIN", Some("delete")) => Line::Begin(Op::Delete { id: num(2)? }),
        ("ACK", Some("create")) => Line::AckCreate {
            id: num(2)?,
            name: text(3)?,
            weight: float(4)?,
            key: text(5)?,
        },
        ("ACK", Some("rotate")) => Line::AckRotate {
            id: num(2)?,
            key: text(3)?,
        },
        ("ACK", Some("patch" | "delete")) => Line::Ack,
        _ => return None,
    })
}
