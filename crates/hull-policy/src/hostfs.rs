//! The view of the host filesystem that lowering needs, behind a trait so the
//! lowered forms are pure functions and golden-tested with a fake.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// What is at a path, without following a final symlink.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeKind {
    Missing,
    Dir,
    File,
    /// A symlink and its target as written.
    Symlink(PathBuf),
}

/// Host filesystem queries used by lowering.
pub trait HostFs {
    /// The kind of node at `path` (lstat).
    fn kind(&self, path: &Path) -> NodeKind;
    /// Names of the entries of a directory, sorted; empty when not a dir.
    fn children(&self, path: &Path) -> Vec<String>;
    /// The entries of a directory with their kinds, sorted by name.
    fn entries(&self, path: &Path) -> Vec<(String, NodeKind)> {
        self.children(path)
            .into_iter()
            .map(|name| {
                let kind = self.kind(&path.join(&name));
                (name, kind)
            })
            .collect()
    }
}

/// The real filesystem.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealFs;

impl HostFs for RealFs {
    fn kind(&self, path: &Path) -> NodeKind {
        match std::fs::symlink_metadata(path) {
            Err(_) => NodeKind::Missing,
            Ok(m) if m.file_type().is_symlink() => match std::fs::read_link(path) {
                Ok(t) => NodeKind::Symlink(t),
                Err(_) => NodeKind::Missing,
            },
            Ok(m) if m.is_dir() => NodeKind::Dir,
            Ok(_) => NodeKind::File,
        }
    }

    fn children(&self, path: &Path) -> Vec<String> {
        let mut v: Vec<String> = match std::fs::read_dir(path) {
            Ok(rd) => rd
                .filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().into_string().ok())
                .collect(),
            Err(_) => Vec::new(),
        };
        v.sort();
        v
    }

    /// The kinds from the directory's own listing (`d_type`: no `lstat`
    /// per entry where the filesystem fills it in, as ext4, xfs, btrfs and
    /// tmpfs do).
    fn entries(&self, path: &Path) -> Vec<(String, NodeKind)> {
        let Ok(rd) = std::fs::read_dir(path) else {
            return Vec::new();
        };
        let mut v: Vec<(String, NodeKind)> = rd
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let kind = match e.file_type() {
                    Err(_) => NodeKind::Missing,
                    Ok(t) if t.is_symlink() => match std::fs::read_link(e.path()) {
                        Ok(target) => NodeKind::Symlink(target),
                        Err(_) => NodeKind::Missing,
                    },
                    Ok(t) if t.is_dir() => NodeKind::Dir,
                    Ok(_) => NodeKind::File,
                };
                Some((name, kind))
            })
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    }
}

/// An in-memory filesystem for golden tests: paths map to kinds; directories
/// are implied by their children.
#[derive(Debug, Default, Clone)]
pub struct FakeFs {
    nodes: BTreeMap<PathBuf, NodeKind>,
}

impl FakeFs {
    pub fn new() -> Self {
        Self::default()
    }

    fn add_parents(&mut self, path: &Path) {
        let mut p = path.parent();
        while let Some(d) = p {
            self.nodes.entry(d.to_path_buf()).or_insert(NodeKind::Dir);
            p = d.parent();
        }
    }

    pub fn dir(mut self, path: &str) -> Self {
        self.add_parents(Path::new(path));
        self.nodes.insert(PathBuf::from(path), NodeKind::Dir);
        self
    }

    pub fn file(mut self, path: &str) -> Self {
        self.add_parents(Path::new(path));
        self.nodes.insert(PathBuf::from(path), NodeKind::File);
        self
    }

    pub fn symlink(mut self, path: &str, target: &str) -> Self {
        self.add_parents(Path::new(path));
        self.nodes.insert(
            PathBuf::from(path),
            NodeKind::Symlink(PathBuf::from(target)),
        );
        self
    }
}

impl HostFs for FakeFs {
    fn kind(&self, path: &Path) -> NodeKind {
        self.nodes.get(path).cloned().unwrap_or(NodeKind::Missing)
    }

    fn children(&self, path: &Path) -> Vec<String> {
        let mut v: Vec<String> = self
            .nodes
            .keys()
            .filter(|p| p.parent() == Some(path) && p.as_path() != path)
            .filter_map(|p| p.file_name().and_then(|n| n.to_str()).map(str::to_string))
            .collect();
        v.sort();
        v
    }
}
