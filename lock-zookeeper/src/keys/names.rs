//! Lock names as ZooKeeper paths, and the queue nodes under them.
//!
//! Every lock name becomes exactly one path segment under the root
//! (`<root>/<segment>`), so no name can reach outside the root or share a
//! parent with another name. The queue nodes of a lock are the parent's
//! children, named like Apache Curator's protected-mode lock nodes:
//! `_c_<owner uuid>-lock-<sequence>`; those of a reader-writer lock like
//! the nodes of Curator's `InterProcessReadWriteLock`,
//! `_c_<owner uuid>-__READ__<sequence>` and `_c_<owner uuid>-__WRIT__<sequence>`.
//! A queue node's data is the holder's label ([`NodeData`]).

use lockcore::{Access, FencingToken, HolderLabel, LockError, LockName};

use crate::error::BACKEND;
use uuid::Uuid;

/// Whether ZooKeeper refuses `c` in a path. Its `PathUtils.validatePath`
/// refuses U+0001-U+001F, U+007F-U+009F, U+D800-U+F8FF and U+FFF0-U+FFFF
/// as UTF-16 units, so every character outside the Basic Multilingual Plane
/// (a surrogate pair there) is refused too. (NUL is refused as well.)
pub(crate) fn refused_by_zookeeper(c: char) -> bool {
    matches!(c, '\u{0}'..='\u{1f}' | '\u{7f}'..='\u{9f}' | '\u{e000}'..='\u{f8ff}' | '\u{fff0}'..)
}

/// The path segment of `name`: the name itself, except that `%`, `/` and
/// every character ZooKeeper refuses are percent-encoded (as UTF-8 bytes,
/// [`LockName::escaped`]), and the names `.` and `..` have their dots encoded.
///
/// Injective: percent-decoding the segment gives the name back, and `%` is
/// always encoded, so no two names share a segment.
pub(crate) fn segment(name: &LockName) -> String {
    match name.as_str() {
        dots @ ("." | "..") => "%2E".repeat(dots.len()),
        _ => name.escaped(|c| c == '/' || refused_by_zookeeper(c)),
    }
}

/// The lock name a root child's segment came from (the inverse of the
/// name-to-path mapping; see the crate docs), for tests and
/// tools that list the root.
pub fn decode_segment(segment: &str) -> Option<String> {
    percent_encoding::percent_decode_str(segment)
        .decode_utf8()
        .ok()
        .map(|s| s.into_owned())
}

/// The infixes between the owner's uuid and the sequence number: a lock's
/// node (Curator's `InterProcessMutex` names it `lock-`), a reader-writer
/// lock's read and write nodes (Curator's `__READ__` and `__WRIT__`).
const MARKS: [(&str, Option<Access>); 3] = [
    ("-lock-", None),
    ("-__READ__", Some(Access::Read)),
    ("-__WRIT__", Some(Access::Write)),
];
const PROTECTED: &str = "_c_";

/// The infix of a node of a lock (`None`) or of a reader-writer lock's `access`.
fn mark(access: Option<Access>) -> &'static str {
    match access {
        None => MARKS[0].0,
        Some(Access::Read) => MARKS[1].0,
        Some(Access::Write) => MARKS[2].0,
    }
}

/// The name prefix of the queue node of owner `guid`, for a lock (`None`)
/// or a reader-writer lock's `access` (ZooKeeper appends the sequence
/// number). The uuid lets a client find its own node after a create whose
/// reply was lost ("protected mode").
pub(crate) fn node_prefix(guid: Uuid, access: Option<Access>) -> String {
    format!("{PROTECTED}{}{}", guid.hyphenated(), mark(access))
}

/// A queue node, parsed from its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct QueueNode {
    /// The node's name (one path segment).
    pub(crate) name: String,
    /// Its owner's uuid.
    pub(crate) guid: Uuid,
    /// Its sequence number, as ZooKeeper's signed 32-bit counter read
    /// unsigned: a counter that wrapped past 2^31 still sorts after the
    /// nodes created before it.
    pub(crate) sequence: u32,
    /// A reader-writer lock's read or write node; `None`: a lock's node.
    pub(crate) access: Option<Access>,
}

impl QueueNode {
    /// The sequence number of a queue node's name, cheaply (for looking it
    /// up among nodes already parsed).
    pub(crate) fn sequence_of(name: &str) -> Option<u32> {
        let (_, sequence) = MARKS.iter().find_map(|(m, _)| name.rsplit_once(m))?;
        sequence.parse::<i32>().ok().map(|s| s as u32)
    }

    /// Parses `_c_<uuid>-lock-<sequence>`, `_c_<uuid>-__READ__<sequence>` or
    /// `_c_<uuid>-__WRIT__<sequence>`; `None` for any other child.
    pub(crate) fn parse(name: &str) -> Option<QueueNode> {
        let rest = name.strip_prefix(PROTECTED)?;
        let (guid, rest) = rest.split_at_checked(36)?;
        let guid = Uuid::try_parse(guid).ok()?;
        let (access, sequence) =
            (MARKS.iter()).find_map(|&(m, access)| rest.strip_prefix(m).map(|s| (access, s)))?;
        if sequence.is_empty()
            || !sequence
                .bytes()
                .enumerate()
                .all(|(i, b)| b.is_ascii_digit() || (i == 0 && b == b'-'))
        {
            return None;
        }
        let sequence = sequence.parse::<i32>().ok()? as u32;
        Some(QueueNode {
            name: name.to_owned(),
            guid,
            sequence,
            access,
        })
    }

    /// Whether this node keeps a reader behind it waiting: any node but a
    /// read (a write, or another recipe's lock node in the same parent).
    pub(crate) fn blocks_readers(&self) -> bool {
        self.access != Some(Access::Read)
    }
}

/// The queue of a lock, in grant order, from the parent's children.
#[derive(Debug, Clone, Default)]
pub(crate) struct Queue {
    nodes: Vec<QueueNode>,
}

impl Queue {
    /// The queue nodes among `children`, ordered by sequence number.
    pub(crate) fn new(children: &[String]) -> Queue {
        let mut nodes: Vec<QueueNode> = children
            .iter()
            .filter_map(|c| QueueNode::parse(c))
            .collect();
        nodes.sort_by_key(|n| n.sequence);
        Queue { nodes }
    }

    /// The queue nodes, by sequence number.
    pub(crate) fn nodes(&self) -> &[QueueNode] {
        &self.nodes
    }

    /// The holder: the first node.
    pub(crate) fn head(&self) -> Option<&QueueNode> {
        self.nodes.first()
    }

    /// Whether `name` is the only queue node.
    pub(crate) fn is_only(&self, name: &str) -> bool {
        matches!(self.nodes.as_slice(), [only] if only.name == name)
    }

    /// Where `name` stands (0: it holds the lock), `None` if absent.
    pub(crate) fn position(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.name == name)
    }

    /// The first node of owner `guid`.
    pub(crate) fn first_of(&self, guid: Uuid) -> Option<&QueueNode> {
        self.nodes.iter().find(|n| n.guid == guid)
    }

    /// Every node of owner `guid`.
    pub(crate) fn all_of(&self, guid: Uuid) -> impl Iterator<Item = &QueueNode> {
        self.nodes.iter().filter(move |n| n.guid == guid)
    }

    /// Whether node `name`, queued for a lock (`None`) or a reader-writer
    /// lock's `access`, may hold now: a read while no other node than reads
    /// is ahead of it, anything else when it is first.
    pub(crate) fn admits(&self, name: &str, access: Option<Access>) -> bool {
        match (self.position(name), access) {
            (Some(at), Some(Access::Read)) => !self.nodes[..at].iter().any(|n| n.blocks_readers()),
            (at, _) => at == Some(0),
        }
    }

    /// The nodes of a reader-writer lock that may hold now: the reads
    /// ahead of every other node, or else the first node alone.
    pub(crate) fn admitted(&self) -> &[QueueNode] {
        match self.nodes.iter().position(|n| n.blocks_readers()) {
            Some(0) => &self.nodes[..1],
            Some(first) => &self.nodes[..first],
            None => &self.nodes,
        }
    }
}

/// What distlock writes into a queue node when it creates it: the holder's
/// label, as UTF-8 text (what `zkCli get` shows), and, once the fence floor
/// was raised, a second line `fence-offset=<n>`: the floor's offset in force
/// at the create, which the node's fence adds to its `czxid` (see
/// [`crate::fence::floor`]). Written in the create itself, so a node never exists
/// without it.
///
/// A node kept by `set_remaining` (see [`crate::locks::remaining`]) is
/// created again, so its `czxid` is not its grant's: it carries its fence
/// itself instead, as a line `fence=<n>`, which every reader takes over
/// `czxid + offset`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct NodeData {
    /// Who holds (or waits), in words; `None` for a node written without one
    /// (an older version of this crate; another recipe's data that is no
    /// valid label).
    pub(crate) label: Option<HolderLabel>,
    /// Added to the node's `czxid` to make its fence (0: none).
    pub(crate) offset: u64,
    /// The fence of a kept node: its grant's.
    pub(crate) fence: Option<FencingToken>,
}

const OFFSET: &str = "fence-offset=";
const FENCE: &str = "fence=";

impl NodeData {
    /// The data of a node for a holder labelled `label`, created while the
    /// fence floor's offset is `offset`.
    pub(crate) fn new(label: Option<&HolderLabel>, offset: u64) -> NodeData {
        NodeData {
            label: label.cloned(),
            offset,
            fence: None,
        }
    }

    /// The data of the node that keeps the grant of `fence`, labelled
    /// `label`, once its remaining time was set.
    pub(crate) fn kept(label: Option<&HolderLabel>, fence: FencingToken) -> NodeData {
        NodeData {
            label: label.cloned(),
            offset: 0,
            fence: Some(fence),
        }
    }

    /// The bytes to create the node with.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut data = self
            .label
            .as_ref()
            .map(|l| l.to_string())
            .unwrap_or_default();
        if self.offset > 0 {
            data.push('\n');
            data.push_str(OFFSET);
            data.push_str(&self.offset.to_string());
        }
        if let Some(fence) = self.fence {
            data.push('\n');
            data.push_str(FENCE);
            data.push_str(&fence.get().to_string());
        }
        data.into_bytes()
    }

    /// Reads a node's data. The label is the first line, if it is a valid
    /// label; an offset or fence line that does not parse counts as none,
    /// and other lines are left for later versions.
    pub(crate) fn decode(data: &[u8]) -> NodeData {
        let mut lines = data.split(|&b| b == b'\n');
        let label = (lines.next())
            .and_then(|l| std::str::from_utf8(l).ok())
            .and_then(|l| HolderLabel::new(l).ok());
        let rest: Vec<&str> = (lines.filter_map(|l| std::str::from_utf8(l).ok())).collect();
        let offset = (rest.iter())
            .find_map(|l| l.strip_prefix(OFFSET)?.parse().ok())
            .unwrap_or(0);
        let fence = (rest.iter())
            .find_map(|l| l.strip_prefix(FENCE)?.parse().ok())
            .and_then(FencingToken::new);
        NodeData {
            label,
            offset,
            fence,
        }
    }

    /// The fence of a node with this data and `czxid`: the one it carries
    /// (a kept node), else `czxid` plus its offset.
    pub(crate) fn fence(&self, czxid: i64) -> Result<FencingToken, LockError> {
        if let Some(fence) = self.fence {
            return Ok(fence);
        }
        let base = FencingToken::from_store(BACKEND, czxid)?;
        base.get()
            .checked_add(self.offset)
            .and_then(FencingToken::new)
            .ok_or_else(|| {
                LockError::store(
                    BACKEND,
                    format!("fence {czxid} + offset {} is past 2^64", self.offset),
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(s: &str) -> String {
        segment(&LockName::new(s).unwrap())
    }

    #[test]
    fn segments_stay_single_and_readable() {
        assert_eq!(seg("billing"), "billing");
        assert_eq!(seg("a/b"), "a%2Fb");
        assert_eq!(seg("a%2Fb"), "a%252Fb");
        assert_eq!(seg("."), "%2E");
        assert_eq!(seg(".."), "%2E%2E");
        assert_eq!(seg("..."), "...");
        assert_eq!(seg("../../x"), "..%2F..%2Fx");
        assert_eq!(seg("/zookeeper/quota"), "%2Fzookeeper%2Fquota");
        assert_eq!(seg("zookeeper"), "zookeeper");
        assert_eq!(seg("Ünï 🔒"), "Ünï %F0%9F%94%92");
        assert_eq!(seg("\u{e000}p"), "%EE%80%80p");
        assert_eq!(seg("\u{fff0}"), "%EF%BF%B0");
        assert_eq!(seg("\u{fffd}"), "%EF%BF%BD");
        assert_eq!(seg("\u{ffef}\u{202e}\u{200b}"), "\u{ffef}\u{202e}\u{200b}");
    }

    #[test]
    fn segments_decode_back() {
        for s in ["a/b", "%", "%25", ".", "..", "🔒/\u{e000}", "x\u{ffff}"] {
            assert_eq!(decode_segment(&seg(s)).as_deref(), Some(s));
        }
    }

    #[test]
    fn queue_nodes_parse_and_sort_across_the_wrap() {
        let a = Uuid::new_v4();
        let b = Uuid::new_v4();
        let children = vec![
            format!("{}-2147483648", node_prefix(a, None)),
            format!("{}2147483647", node_prefix(b, None)),
            format!("{}0000000007", node_prefix(b, None)),
            "garbage".to_owned(),
            format!("{}x1", node_prefix(a, None)),
            node_prefix(a, None),
        ];
        let q = Queue::new(&children);
        let order: Vec<u32> = q.nodes.iter().map(|n| n.sequence).collect();
        assert_eq!(order, vec![7, 2147483647, 2147483648]);
        assert_eq!(q.head().unwrap().guid, b);
        assert_eq!(q.position(&children[0]), Some(2));
        assert_eq!(q.first_of(a).unwrap().name, children[0]);
        assert_eq!(q.all_of(b).count(), 2);
    }

    /// Read and write nodes are named as Curator's reader-writer lock names
    /// them, and sort with each other by sequence number: a read is
    /// admitted while only reads are ahead of it, a write when it is first.
    #[test]
    fn read_and_write_nodes_parse_and_admit_by_the_rules() {
        let (r, w) = (Some(Access::Read), Some(Access::Write));
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        let name =
            |guid, access, sequence: u32| format!("{}{sequence:010}", node_prefix(guid, access));
        assert_eq!(
            name(a, r, 1),
            format!("_c_{}-__READ__0000000001", a.hyphenated())
        );
        assert_eq!(
            name(a, w, 2),
            format!("_c_{}-__WRIT__0000000002", a.hyphenated())
        );
        let children = [name(a, r, 4), name(b, w, 5), name(b, r, 1), name(a, r, 7)];
        assert_eq!(QueueNode::sequence_of(&children[1]), Some(5));
        let q = Queue::new(&children);
        let parsed: Vec<_> = q.nodes.iter().map(|n| (n.sequence, n.access)).collect();
        assert_eq!(parsed, vec![(1, r), (4, r), (5, w), (7, r)]);
        assert!(q.admits(&children[2], r) && q.admits(&children[0], r));
        assert!(!q.admits(&children[1], w), "a write behind reads");
        assert!(!q.admits(&children[3], r), "a read behind a write");
        assert!(!q.admits("missing", r));
        let held: Vec<_> = q.admitted().iter().map(|n| n.sequence).collect();
        assert_eq!(held, vec![1, 4]);
        let write_first = Queue::new(&[children[1].clone(), children[3].clone()]);
        let held: Vec<_> = write_first.admitted().iter().map(|n| n.sequence).collect();
        assert_eq!(held, vec![5], "a write first holds alone");
        assert!(write_first.admits(&children[1], w));
        // Another recipe's lock node in the same parent counts as a write.
        let mixed = Queue::new(&[name(a, None, 1), name(b, r, 2)]);
        assert!(!mixed.admits(&name(b, r, 2), r));
    }

    #[test]
    fn node_data_round_trips_and_reads_what_others_wrote() {
        let label = HolderLabel::new("worker 7 — ünï 🔒").unwrap();
        let data = NodeData::new(Some(&label), 0);
        assert_eq!(NodeData::decode(&data.encode()), data);
        assert_eq!(data.encode(), label.as_str().as_bytes());
        let raised = NodeData::new(Some(&label), 1_000_007);
        assert_eq!(NodeData::decode(&raised.encode()), raised);
        assert_eq!(raised.fence(5).unwrap().get(), 1_000_012);
        assert_eq!(NodeData::new(None, 3).encode(), b"\nfence-offset=3");
        assert_eq!(NodeData::decode(b"\nfence-offset=3").offset, 3);
        assert_eq!(NodeData::decode(b"w\nfence-offset=x").offset, 0);
        assert!(NodeData::new(None, u64::MAX).fence(5).is_err());
        // A kept node's fence is its grant's, whatever its own czxid.
        let fence = FencingToken::new(1_000_012).unwrap();
        let kept = NodeData::kept(Some(&label), fence);
        assert_eq!(NodeData::decode(&kept.encode()), kept);
        assert_eq!(
            kept.encode(),
            format!("{label}\nfence=1000012").into_bytes()
        );
        assert_eq!(kept.fence(7_000_000).unwrap(), fence);
        assert_eq!(NodeData::decode(b"w\nfence=x").fence, None);
        assert_eq!(NodeData::decode(b"w\nfence=0").fence, None);
        assert_eq!(
            NodeData::decode(b"w\nfence-offset=3\nfence=9")
                .fence(5)
                .unwrap()
                .get(),
            9
        );
        assert!(NodeData::default().fence(0).is_err());
        // An older version wrote nothing; other recipes write what they like.
        assert_eq!(NodeData::decode(b""), NodeData::default());
        assert_eq!(NodeData::decode(&[0xff, 0xfe]).label, None);
        assert_eq!(
            NodeData::decode(b"10.0.0.7").label.map(|l| l.to_string()),
            Some("10.0.0.7".to_owned())
        );
        assert_eq!(
            NodeData::decode(b"worker 7\nsomething=new").label,
            Some(HolderLabel::new("worker 7").unwrap())
        );
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn names() -> impl Strategy<Value = LockName> {
            let specials = prop::sample::select(vec![
                '/', '.', '%', '2', 'F', '\u{e000}', '\u{fff0}', '🔒', 'a',
            ]);
            let chars = prop_oneof![prop::char::any(), specials];
            prop::collection::vec(chars, 1..48).prop_filter_map("not a valid lock name", |cs| {
                LockName::new(cs.into_iter().collect::<String>()).ok()
            })
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(2000))]

            #[test]
            fn segments_are_single_valid_and_decode_back(name in names()) {
                let s = segment(&name);
                prop_assert!(!s.contains('/'));
                prop_assert!(s != "." && s != ".." && !s.is_empty());
                prop_assert!(!s.chars().any(refused_by_zookeeper), "{:?}", s);
                let decoded = decode_segment(&s);
                prop_assert_eq!(decoded.as_deref(), Some(name.as_str()));
            }

            #[test]
            fn distinct_names_get_distinct_segments(a in names(), b in names()) {
                prop_assume!(a != b);
                prop_assert_ne!(segment(&a), segment(&b));
            }
        }
    }
}
