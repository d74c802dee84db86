//! Images made here, byte by byte, in every form hull reads, then read and
//! flattened: what lands, what is whited out, and what is refused.
#![cfg(target_os = "linux")]
#![allow(clippy::unwrap_used)]

use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use hull_oci::{Limits, Reference};
use sha2::{Digest, Sha256};

enum E<'a> {
    Dir(&'a str),
    File(&'a str, &'a [u8]),
    Symlink(&'a str, &'a str),
}

fn layer(entries: &[E<'_>]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        let mut h = tar::Header::new_gnu();
        match e {
            E::Dir(n) => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(0o755);
                h.set_size(0);
                b.append_data(&mut h, n, &[][..]).unwrap();
            }
            E::File(n, body) => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(0o644);
                h.set_size(body.len() as u64);
                // The name as it is, `..` and all (the tar crate refuses
                // to write those; a hostile layer has them).
                if n.len() > 100 {
                    // A long name: written the GNU way, as tar does.
                    b.append_data(&mut h, n, *body).unwrap();
                    continue;
                }
                let field = &mut h.as_old_mut().name;
                field[..n.len()].copy_from_slice(n.as_bytes());
                h.set_cksum();
                b.append(&h, *body).unwrap();
            }
            E::Symlink(n, t) => {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_mode(0o777);
                h.set_size(0);
                b.append_link(&mut h, n, t).unwrap();
            }
        }
    }
    b.into_inner().unwrap()
}

fn sha(b: &[u8]) -> String {
    Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

fn gzip(b: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(b).unwrap();
    e.finish().unwrap()
}

fn config(layers: &[Vec<u8>]) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Env": ["PATH=/usr/bin", "GREETING=hi"], "WorkingDir": "/work", "User": "1000", "Cmd": ["sh"]},
        "rootfs": {"type": "layers", "diff_ids": layers.iter().map(|l| format!("sha256:{}", sha(l))).collect::<Vec<_>>()}
    }))
    .unwrap()
}

/// An OCI layout's files: (name, bytes). Layers gzip'd when `gz`.
fn oci_files(layers: &[Vec<u8>], gz: bool, tag: &str) -> Vec<(String, Vec<u8>)> {
    let mut files = vec![(
        "oci-layout".to_string(),
        br#"{"imageLayoutVersion":"1.0.0"}"#.to_vec(),
    )];
    let cfg = config(layers);
    let mut descs = Vec::new();
    for l in layers {
        let blob = if gz { gzip(l) } else { l.clone() };
        descs.push(serde_json::json!({
            "mediaType": if gz { "application/vnd.oci.image.layer.v1.tar+gzip" } else { "application/vnd.oci.image.layer.v1.tar" },
            "digest": format!("sha256:{}", sha(&blob)), "size": blob.len()}));
        files.push((format!("blobs/sha256/{}", sha(&blob)), blob));
    }
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": format!("sha256:{}", sha(&cfg)), "size": cfg.len()},
        "layers": descs,
    }))
    .unwrap();
    let index = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": format!("sha256:{}", sha(&manifest)), "size": manifest.len(),
            "annotations": {"org.opencontainers.image.ref.name": tag}}],
    }))
    .unwrap();
    files.push((format!("blobs/sha256/{}", sha(&cfg)), cfg));
    files.push((format!("blobs/sha256/{}", sha(&manifest)), manifest));
    files.push(("index.json".into(), index));
    files
}

/// What `docker save` writes: manifest.json, the config, `<id>/layer.tar`.
fn docker_files(layers: &[Vec<u8>]) -> Vec<(String, Vec<u8>)> {
    let cfg = config(layers);
    let mut files = Vec::new();
    let mut names = Vec::new();
    for l in layers {
        let n = format!("{}/layer.tar", sha(l));
        files.push((n.clone(), l.clone()));
        names.push(n);
    }
    let cfg_name = format!("{}.json", sha(&cfg));
    files.push((cfg_name.clone(), cfg));
    files.push((
        "manifest.json".into(),
        serde_json::to_vec(
            &serde_json::json!([{"Config": cfg_name, "RepoTags": ["t:1"], "Layers": names}]),
        )
        .unwrap(),
    ));
    files
}

fn tar_of(files: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (n, body) in files {
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o644);
        h.set_size(body.len() as u64);
        h.set_entry_type(tar::EntryType::Regular);
        b.append_data(&mut h, n, &body[..]).unwrap();
    }
    b.into_inner().unwrap()
}

struct Store {
    _dir: tempfile::TempDir,
    path: PathBuf,
    fd: OwnedFd,
}

fn store() -> Store {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let fd = std::fs::File::open(&path).unwrap().into();
    Store {
        _dir: dir,
        path,
        fd,
    }
}

const LIMITS: Limits = Limits {
    entries: 1000,
    bytes: 1 << 20,
};

/// Reads `reference` and flattens it: the output's entries, name to
/// (kind, contents).
fn flat(reference: &Reference, s: &Store) -> Result<Vec<(String, char, Vec<u8>)>, String> {
    let image = hull_oci::read(reference, &s.path, &s.fd, 1 << 24).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    hull_oci::flatten(&image.layers, LIMITS, &mut out).map_err(|e| e.to_string())?;
    let mut a = tar::Archive::new(&out[..]);
    let mut got = Vec::new();
    for e in a.entries().unwrap() {
        let mut e = e.unwrap();
        let name = e
            .path()
            .unwrap()
            .to_string_lossy()
            .trim_end_matches('/')
            .to_string();
        let kind = match e.header().entry_type() {
            tar::EntryType::Directory => 'd',
            tar::EntryType::Symlink => 'l',
            _ => 'f',
        };
        let mut body = Vec::new();
        e.read_to_end(&mut body).unwrap();
        got.push((name, kind, body));
    }
    got.sort();
    Ok(got)
}

fn two_layers() -> Vec<Vec<u8>> {
    vec![
        layer(&[
            E::Dir("etc"),
            E::File("etc/a", b"1"),
            E::File("etc/b", b"b"),
            E::Dir("d"),
            E::File("d/x", b"x"),
            E::Dir("gone"),
            E::File("gone/inside", b"i"),
        ]),
        layer(&[
            E::File("etc/.wh.b", b""),
            E::File("d/.wh..wh..opq", b""),
            E::File("d/y", b"y"),
            E::File("etc/a", b"2"),
            E::File(".wh.gone", b""),
        ]),
    ]
}

fn expected() -> Vec<(String, char, Vec<u8>)> {
    let mut v = vec![
        ("d".to_string(), 'd', vec![]),
        ("d/y".to_string(), 'f', b"y".to_vec()),
        ("etc".to_string(), 'd', vec![]),
        ("etc/a".to_string(), 'f', b"2".to_vec()),
    ];
    v.sort();
    v
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

#[test]
fn every_form_stacks_its_layers_as_a_runtime_would() {
    let t = tempfile::tempdir().unwrap();
    let layers = two_layers();
    let oci = write(
        t.path(),
        "oci.tar",
        &tar_of(&oci_files(&layers, true, "v1")),
    );
    let docker = write(t.path(), "docker.tar", &tar_of(&docker_files(&layers)));
    let layout = t.path().join("layout");
    for (n, b) in oci_files(&layers, false, "v1") {
        let p = layout.join(&n);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, b).unwrap();
    }
    for r in [
        Reference::OciArchive(oci),
        Reference::DockerArchive(docker),
        Reference::OciLayout {
            dir: layout.clone(),
            tag: Some("v1".into()),
        },
        Reference::OciLayout {
            dir: layout,
            tag: None,
        },
    ] {
        let s = store();
        assert_eq!(
            flat(&r, &s).unwrap_or_else(|e| panic!("{r}: {e}")),
            expected(),
            "{r}"
        );
        let image = hull_oci::read(&r, &s.path, &s.fd, 1 << 24).unwrap();
        assert_eq!(image.config.working_dir.as_deref(), Some("/work"), "{r}");
        assert_eq!(image.config.user.as_deref(), Some("1000"), "{r}");
    }
}

#[test]
fn a_zstd_layer_is_read_as_gzip_and_plain_ones_are() {
    let t = tempfile::tempdir().unwrap();
    let layers = two_layers();
    let mut files = oci_files(&layers, false, "z");
    // The plain layer blobs recompressed with zstd, the manifest rewritten.
    let mut manifest: Option<(usize, serde_json::Value)> = None;
    for (i, (_, body)) in files.iter().enumerate() {
        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) {
            if v.get("layers").is_some() {
                manifest = Some((i, v));
            }
        }
    }
    let (at, mut m) = manifest.unwrap();
    let mut add = Vec::new();
    for (k, l) in layers.iter().enumerate() {
        let z =
            ruzstd::encoding::compress_to_vec(&l[..], ruzstd::encoding::CompressionLevel::Fastest);
        m["layers"][k]["digest"] = format!("sha256:{}", sha(&z)).into();
        m["layers"][k]["mediaType"] = "application/vnd.oci.image.layer.v1.tar+zstd".into();
        add.push((format!("blobs/sha256/{}", sha(&z)), z));
    }
    let body = serde_json::to_vec(&m).unwrap();
    let old = files[at].0.clone();
    files[at] = (format!("blobs/sha256/{}", sha(&body)), body.clone());
    let index = files.iter_mut().find(|(n, _)| n == "index.json").unwrap();
    let text = String::from_utf8(index.1.clone()).unwrap();
    let old_digest = old.trim_start_matches("blobs/sha256/");
    index.1 = text
        .replace(old_digest, &sha(&body))
        .replace(
            &format!("\"size\":{}", files_len_of(&text)),
            &format!("\"size\":{}", body.len()),
        )
        .into_bytes();
    files.extend(add);
    let p = write(t.path(), "zstd.tar", &tar_of(&files));
    assert_eq!(
        flat(&Reference::OciArchive(p), &store()).unwrap(),
        expected()
    );
}

/// The size the index gives its one manifest.
fn files_len_of(index: &str) -> u64 {
    let v: serde_json::Value = serde_json::from_str(index).unwrap();
    v["manifests"][0]["size"].as_u64().unwrap()
}

#[test]
fn one_layer_with_nothing_to_apply_is_taken_as_it_is() {
    let t = tempfile::tempdir().unwrap();
    let l = layer(&[
        E::Dir("bin"),
        E::File("bin/sh", b"#!"),
        E::Symlink("sh", "bin/sh"),
    ]);
    let oci = write(
        t.path(),
        "one.tar",
        &tar_of(&oci_files(std::slice::from_ref(&l), true, "x")),
    );
    let s = store();
    let image = hull_oci::read(&Reference::OciArchive(oci), &s.path, &s.fd, 1 << 24).unwrap();
    let mut out = Vec::new();
    hull_oci::flatten(&image.layers, LIMITS, &mut out).unwrap();
    assert_eq!(out, l, "the layer's own bytes");
}

#[test]
fn hostile_layers_are_refused_by_name() {
    let t = tempfile::tempdir().unwrap();
    let cases: Vec<(&str, Vec<Vec<u8>>, &str)> = vec![
        (
            "climbs",
            vec![layer(&[E::File("../../etc/cron.d/x", b"x")])],
            "\"../../etc/cron.d/x\": a `..` component",
        ),
        (
            "absolute",
            vec![layer(&[E::File("/etc/x", b"x")])],
            "an absolute path",
        ),
        (
            "agent",
            vec![
                layer(&[E::Dir("opt")]),
                layer(&[E::File("opt/.wh.hull", b"")]),
            ],
            "removes /opt/hull",
        ),
        (
            "through a link",
            vec![
                layer(&[E::Symlink("a", "/etc")]),
                layer(&[E::File("a/passwd", b"root::0:0::/:/bin/sh\n")]),
            ],
            "\"a/passwd\": lies under \"a\", a symbolic link",
        ),
        (
            "a whiteout of nothing",
            vec![layer(&[E::File("etc/.wh.", b"")])],
            "a whiteout that names nothing",
        ),
    ];
    for (what, layers, want) in cases {
        let p = write(
            t.path(),
            &format!("{what}.tar"),
            &tar_of(&oci_files(&layers, false, "x")),
        );
        let e = flat(&Reference::OciArchive(p), &store()).expect_err(what);
        assert!(e.contains(want), "{what}: {e}");
        assert!(e.contains("image layer"), "{what}: {e}");
    }
}

#[test]
fn a_blob_or_layer_that_is_not_what_its_digest_says_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let layers = two_layers();
    // A blob stored under another blob's name.
    let mut files = oci_files(&layers, true, "x");
    let first = files
        .iter()
        .position(|(n, _)| n.starts_with("blobs/"))
        .unwrap();
    files[first].1.push(0);
    let p = write(t.path(), "swapped.tar", &tar_of(&files));
    let e = flat(&Reference::OciArchive(p), &store()).unwrap_err();
    assert!(e.contains("not the blob its name says"), "{e}");
    // A docker archive whose layer is not its config's diff_id.
    let mut files = docker_files(&layers);
    let at = files
        .iter()
        .position(|(n, _)| n.ends_with("layer.tar"))
        .unwrap();
    files[at].1 = layer(&[E::File("etc/evil", b"x")]);
    let p = write(t.path(), "bad-layer.tar", &tar_of(&files));
    let e = flat(&Reference::DockerArchive(p), &store()).unwrap_err();
    assert!(e.contains("not the sha256:"), "{e}");
    assert!(e.contains("image layer 1"), "{e}");
}

#[test]
fn a_layout_s_planted_link_is_not_followed() {
    let t = tempfile::tempdir().unwrap();
    let layers = two_layers();
    let layout = t.path().join("layout");
    let files = oci_files(&layers, false, "x");
    for (n, b) in &files {
        let p = layout.join(n);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, b).unwrap();
    }
    // The first layer's blob replaced by a link to a file elsewhere.
    let secret = write(t.path(), "secret", b"not the project's");
    let blob = layout.join(&files[1].0);
    std::fs::remove_file(&blob).unwrap();
    std::os::unix::fs::symlink(&secret, &blob).unwrap();
    let e = flat(
        &Reference::OciLayout {
            dir: layout,
            tag: None,
        },
        &store(),
    )
    .unwrap_err();
    assert!(e.contains(&files[1].0), "{e}");
}

#[test]
fn more_entries_than_the_limit_are_refused() {
    let t = tempfile::tempdir().unwrap();
    let names: Vec<String> = (0..1001).map(|i| format!("f{i}")).collect();
    let entries: Vec<E<'_>> = names.iter().map(|n| E::File(n, b"")).collect();
    let p = write(
        t.path(),
        "many.tar",
        &tar_of(&oci_files(&[layer(&entries)], false, "x")),
    );
    let e = flat(&Reference::OciArchive(p), &store()).unwrap_err();
    assert!(e.contains("more entries"), "{e}");
}

/// A tar block of a GNU long-name header claiming `size` bytes of name.
fn long_name_header(size: u64) -> Vec<u8> {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::GNULongName);
    h.set_size(size);
    {
        let field = &mut h.as_old_mut().name;
        field[..13].copy_from_slice(b"././@LongLink");
    }
    h.set_cksum();
    let mut b = h.as_bytes().to_vec();
    b.extend_from_slice(&[0u8; 1024]);
    b
}

#[test]
fn a_metadata_entry_the_parser_would_hold_whole_is_refused_by_its_header() {
    let t = tempfile::tempdir().unwrap();
    // In a layer: 1 GiB of "name" claimed, refused before any is read.
    let hostile = long_name_header(1 << 30);
    let p = write(
        t.path(),
        "long.tar",
        &tar_of(&oci_files(&[hostile], false, "x")),
    );
    let e = flat(&Reference::OciArchive(p), &store()).unwrap_err();
    assert!(e.contains("a metadata entry"), "{e}");
    // In the archive itself.
    let p = write(t.path(), "long-archive.tar", &long_name_header(1 << 30));
    let e = flat(&Reference::OciArchive(p), &store()).unwrap_err();
    assert!(e.contains("a metadata entry"), "{e}");
    // The control: a long name of a sane size passes.
    let name = format!("{}/f", "d".repeat(300));
    let l = layer(&[E::File(&name, b"x")]);
    let p = write(t.path(), "sane.tar", &tar_of(&oci_files(&[l], false, "x")));
    let got = flat(&Reference::OciArchive(p), &store()).unwrap();
    assert_eq!(got, [(name, 'f', b"x".to_vec())]);
}

#[test]
fn a_layer_that_goes_on_past_its_entries_is_cut_and_refused() {
    let t = tempfile::tempdir().unwrap();
    // 64 MiB of zeros after the end blocks, which gzip makes small.
    let mut l = layer(&[E::File("a", b"a")]);
    l.extend(std::iter::repeat_n(0u8, 64 << 20));
    let small = Limits {
        entries: 10,
        bytes: 1 << 20,
    };
    let oci = write(t.path(), "long.tar", &tar_of(&oci_files(&[l], true, "x")));
    let s = store();
    let image = hull_oci::read(&Reference::OciArchive(oci), &s.path, &s.fd, 1 << 30).unwrap();
    let t0 = std::time::Instant::now();
    let e = hull_oci::flatten(&image.layers, small, &mut std::io::sink())
        .unwrap_err()
        .to_string();
    assert!(e.contains("not the sha256:"), "{e}");
    assert!(t0.elapsed() < std::time::Duration::from_secs(5));
    // The control: the same layer within limits that hold it passes.
    let big = Limits {
        entries: 10,
        bytes: 128 << 20,
    };
    hull_oci::flatten(&image.layers, big, &mut std::io::sink()).unwrap();
}
