//! Unpacking an agent's archive into a folder, trusting nothing in it. The format is the
//! name's suffix (`.zip`, `.tar.gz`/`.tgz`, `.tar.bz2`/`.tbz2`, `.tar`; anything else is the
//! program itself). Every entry is checked before anything is written: no absolute path, no
//! `..`, no path through a symlink (each folder on the way is looked at on disk, so a link the
//! archive made earlier cannot be written through), a symlink only when its target stays inside
//! the folder, a hard link only to a file the archive already put inside it, no devices or
//! fifos. Once all is unpacked, every symlink is followed link by link on disk (`links`), and
//! one that leads out, alone or through others, dangling or not, fails the unpack. The unpacked
//! bytes (counted as written, not as the headers claim) and the entries are bounded, and so is
//! all that a tar stream decompresses to, its headers and extension records included
//! (`bounded`); an entry that is not a file carries at most 64 KiB. Executable bits are kept;
//! write permission for the group and others, and set-id and sticky bits, are not.

use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::rc::Rc;

use crate::install::bounded::{BudgetedReader, MAX_NON_FILE_DATA, ReadBudget};
use crate::install::error::InstallError;
use crate::install::links::check_links;

/// The permission bits an unpacked file or folder may keep: no write for the group and
/// others, no set-id or sticky bit.
const KEPT_MODE: u32 = 0o755;

/// How much an archive may unpack to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnpackLimits {
    /// The unpacked bytes, all files together.
    pub max_bytes: u64,
    /// The entries (files, folders and links).
    pub max_entries: usize,
}

impl Default for UnpackLimits {
    /// 2 GiB in 100,000 entries: far above any agent, far below a full disk.
    fn default() -> Self {
        Self {
            max_bytes: 2 << 30,
            max_entries: 100_000,
        }
    }
}

/// The formats an archive can have, by its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ArchiveFormat {
    Zip,
    Tar,
    TarGz,
    TarBz2,
    /// The program itself, not an archive.
    Raw,
}

/// Unpacks the file `archive`, whose format is told by `url_or_name` (the URL it came from or
/// its name), into the existing folder `dest`. A raw program is copied as `dest/<the URL's last
/// path segment>` with mode 0755.
pub fn unpack(
    archive: &Path,
    url_or_name: &str,
    dest: &Path,
    limits: &UnpackLimits,
) -> Result<(), InstallError> {
    let name = file_name(url_or_name);
    let format = format_of(&name)?;
    let mut unpacker = Unpacker {
        dest: dest.to_path_buf(),
        limits: *limits,
        bytes: 0,
        entries: 0,
    };
    let file = fs::File::open(archive)
        .map_err(|e| InstallError::io(format!("opening {}", archive.display()), e))?;
    let mut read = io::BufReader::new(file);
    let budget = Rc::new(ReadBudget::new(limits.max_bytes, limits.max_entries));
    let tarred = match format {
        ArchiveFormat::Zip => unpacker.zip(read),
        ArchiveFormat::Tar => unpacker.tar(BudgetedReader::new(read, budget.clone()), &budget),
        ArchiveFormat::TarGz => {
            let gz = flate2::read::MultiGzDecoder::new(read);
            unpacker.tar(BudgetedReader::new(gz, budget.clone()), &budget)
        }
        ArchiveFormat::TarBz2 => {
            let bz = bzip2::read::MultiBzDecoder::new(read);
            unpacker.tar(BudgetedReader::new(bz, budget.clone()), &budget)
        }
        ArchiveFormat::Raw => {
            let rel = unpacker.relative(Path::new(&name))?;
            if rel.components().count() != 1 {
                return Err(InstallError::Unsafe(format!(
                    "`{name}` is not a file name to save the program as"
                )));
            }
            unpacker.entries += 1;
            unpacker.file(&rel, 0o755, &mut read)
        }
    };
    tarred.map_err(|e| budget.explain(e))?;
    check_links(dest)
}

/// The last path segment of a URL (its query and fragment aside), or the file name of a path.
fn file_name(url_or_name: &str) -> String {
    if let Ok(url) = url::Url::parse(url_or_name)
        && url.scheme().len() > 1
        && let Some(last) = url.path_segments().and_then(|mut s| s.next_back())
    {
        return last.to_owned();
    }
    Path::new(url_or_name)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The format a name's suffix says.
fn format_of(name: &str) -> Result<ArchiveFormat, InstallError> {
    let lower = name.to_ascii_lowercase();
    let ends = |suffixes: &[&str]| suffixes.iter().any(|s| lower.ends_with(s));
    Ok(if ends(&[".zip"]) {
        ArchiveFormat::Zip
    } else if ends(&[".tar.gz", ".tgz"]) {
        ArchiveFormat::TarGz
    } else if ends(&[".tar.bz2", ".tbz2"]) {
        ArchiveFormat::TarBz2
    } else if ends(&[".tar"]) {
        ArchiveFormat::Tar
    } else if ends(&[".tar.xz", ".txz", ".tar.zst", ".xz", ".zst", ".7z", ".rar"]) {
        return Err(InstallError::Archive(format!(
            "`{name}` is in a format this gateway does not unpack (zip, tar.gz, tgz, tar.bz2, \
             tbz2 and tar are)"
        )));
    } else {
        ArchiveFormat::Raw
    })
}

/// An archive's failure to read, as an error.
fn unreadable(e: impl std::fmt::Display) -> InstallError {
    InstallError::Archive(e.to_string())
}

/// The folder being filled, and what has been unpacked into it so far.
struct Unpacker {
    dest: PathBuf,
    limits: UnpackLimits,
    bytes: u64,
    entries: usize,
}

impl Unpacker {
    /// Counts one more entry against the bound.
    fn count(&mut self) -> Result<(), InstallError> {
        self.entries += 1;
        if self.entries > self.limits.max_entries {
            return Err(InstallError::TooLarge(format!(
                "the archive has more than {} entries",
                self.limits.max_entries
            )));
        }
        Ok(())
    }

    /// Every entry of a tar stream, read through `budget`, which is told when an entry's
    /// data is read and when headers are.
    fn tar(&mut self, reader: impl Read, budget: &ReadBudget) -> Result<(), InstallError> {
        use tar::EntryType as T;
        let mut archive = tar::Archive::new(reader);
        let mut entries = archive.entries().map_err(unreadable)?;
        loop {
            budget.between_entries();
            let Some(entry) = entries.next() else {
                return Ok(());
            };
            let mut entry = entry.map_err(unreadable)?;
            budget.in_entry();
            self.count()?;
            let name = entry.path().map_err(unreadable)?.into_owned();
            let kind = entry.header().entry_type();
            let is_file = matches!(kind, T::Regular | T::Continuous | T::GNUSparse);
            if !is_file && entry.size() > MAX_NON_FILE_DATA {
                return Err(InstallError::TooLarge(format!(
                    "the entry `{}` is not a file and carries {} bytes of data (at most {} \
                     are allowed)",
                    name.display(),
                    entry.size(),
                    MAX_NON_FILE_DATA
                )));
            }
            if kind == T::XGlobalHeader {
                continue;
            }
            let rel = self.relative(&name)?;
            let mode = entry.header().mode().unwrap_or(0o644);
            let link = || -> Result<PathBuf, InstallError> {
                match entry.link_name().map_err(unreadable)? {
                    Some(target) => Ok(target.into_owned()),
                    None => Err(unreadable(format!("`{}` links to nothing", name.display()))),
                }
            };
            match kind {
                T::Directory => self.dir(&rel, mode)?,
                T::Symlink => {
                    let target = link()?;
                    self.symlink(&rel, &target)?
                }
                T::Link => {
                    let target = link()?;
                    self.hard_link(&rel, &target)?
                }
                T::Regular | T::Continuous | T::GNUSparse => self.file(&rel, mode, &mut entry)?,
                T::Char | T::Block | T::Fifo => {
                    return Err(InstallError::Unsafe(format!(
                        "`{}` is a device or a fifo, which an agent's archive has no use for",
                        name.display()
                    )));
                }
                other => {
                    return Err(InstallError::Unsafe(format!(
                        "`{}` is a tar entry of an unknown type ({other:?})",
                        name.display()
                    )));
                }
            }
        }
    }

    /// Every entry of a zip file.
    fn zip(&mut self, file: io::BufReader<fs::File>) -> Result<(), InstallError> {
        let mut zip = zip::ZipArchive::new(file).map_err(unreadable)?;
        for i in 0..zip.len() {
            let mut entry = zip.by_index(i).map_err(unreadable)?;
            self.count()?;
            let name = entry.name().map_err(unreadable)?.into_owned();
            let rel = self.relative(Path::new(&name))?;
            if entry.is_dir() {
                self.dir(&rel, entry.unix_mode().unwrap_or(0o755))?;
            } else if entry.is_symlink() {
                let mut target = String::new();
                (&mut entry)
                    .take(4096)
                    .read_to_string(&mut target)
                    .map_err(unreadable)?;
                self.symlink(&rel, Path::new(&target))?;
            } else {
                let mode = entry.unix_mode().unwrap_or(0o644);
                self.file(&rel, mode, &mut entry)?;
            }
        }
        Ok(())
    }

    /// An entry's name as a path inside the folder: refused when absolute or with a `..`;
    /// `.` components dropped, so `./` itself is the empty path.
    fn relative(&self, name: &Path) -> Result<PathBuf, InstallError> {
        let shown = name.display();
        if name.as_os_str().as_encoded_bytes().contains(&0) {
            return Err(InstallError::Unsafe(format!(
                "`{shown}` has a NUL in its name"
            )));
        }
        let mut rel = PathBuf::new();
        for component in name.components() {
            match component {
                Component::Normal(part) => rel.push(part),
                Component::CurDir => {}
                Component::ParentDir => {
                    return Err(InstallError::Unsafe(format!(
                        "the entry `{shown}` has a `..` in its path"
                    )));
                }
                Component::RootDir | Component::Prefix(_) => {
                    return Err(InstallError::Unsafe(format!(
                        "the entry `{shown}` has an absolute path"
                    )));
                }
            }
        }
        Ok(rel)
    }

    /// Makes sure `rel` is a real folder inside, creating what is missing on the way; refused
    /// when any part of it is a symlink or a file.
    fn ensure_dir(&self, rel: &Path) -> Result<(), InstallError> {
        let mut at = self.dest.clone();
        for component in rel.components() {
            at.push(component);
            match fs::symlink_metadata(&at) {
                Ok(meta) if meta.file_type().is_symlink() => {
                    return Err(InstallError::Unsafe(format!(
                        "the entry `{}` passes through the symlink `{}`",
                        rel.display(),
                        self.shown(&at)
                    )));
                }
                Ok(meta) if meta.is_dir() => {}
                Ok(_) => {
                    return Err(InstallError::Unsafe(format!(
                        "the entry `{}` needs `{}` to be a folder, and it is a file",
                        rel.display(),
                        self.shown(&at)
                    )));
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => fs::create_dir(&at)
                    .map_err(|e| InstallError::io(format!("creating {}", at.display()), e))?,
                Err(e) => return Err(InstallError::io(format!("reading {}", at.display()), e)),
            }
        }
        Ok(())
    }

    /// `path` relative to the folder, for messages.
    fn shown(&self, path: &Path) -> String {
        path.strip_prefix(&self.dest)
            .unwrap_or(path)
            .display()
            .to_string()
    }

    /// Clears the place of a new file or link at `rel` (its folders made): an earlier entry of
    /// the same name is replaced, never written through.
    fn place(&self, rel: &Path) -> Result<PathBuf, InstallError> {
        let parent = rel.parent().ok_or_else(|| {
            InstallError::Unsafe(format!("`{}` is not a file's name", rel.display()))
        })?;
        if rel.as_os_str().is_empty() {
            return Err(InstallError::Unsafe(
                "an entry that is not a folder names the archive's root".to_owned(),
            ));
        }
        self.ensure_dir(parent)?;
        let path = self.dest.join(rel);
        match fs::symlink_metadata(&path) {
            Ok(meta) if meta.is_dir() => Err(InstallError::Unsafe(format!(
                "the entry `{}` would replace a folder",
                rel.display()
            ))),
            Ok(_) => fs::remove_file(&path)
                .map(|()| path.clone())
                .map_err(|e| InstallError::io(format!("replacing {}", path.display()), e)),
            Err(_) => Ok(path),
        }
    }

    /// A folder entry.
    fn dir(&mut self, rel: &Path, mode: u32) -> Result<(), InstallError> {
        self.ensure_dir(rel)?;
        let path = self.dest.join(rel);
        let mode = (mode | 0o700) & KEPT_MODE;
        fs::set_permissions(&path, fs::Permissions::from_mode(mode))
            .map_err(|e| InstallError::io(format!("setting the mode of {}", path.display()), e))
    }

    /// A file entry, its bytes counted against the bound as they are written.
    fn file(&mut self, rel: &Path, mode: u32, data: &mut dyn Read) -> Result<(), InstallError> {
        let path = self.place(rel)?;
        let written = |e| InstallError::io(format!("writing {}", path.display()), e);
        let mut out = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(written)?;
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let n = match data.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(unreadable(format!("`{}`: {e}", rel.display()))),
            };
            self.bytes += n as u64;
            if self.bytes > self.limits.max_bytes {
                return Err(InstallError::TooLarge(format!(
                    "the archive unpacks to more than {} bytes",
                    self.limits.max_bytes
                )));
            }
            out.write_all(&buf[..n]).map_err(written)?;
        }
        out.set_permissions(fs::Permissions::from_mode(mode & KEPT_MODE))
            .map_err(written)
    }

    /// A symlink entry, when its target, resolved against the link's folder without looking at
    /// the disk, stays inside.
    fn symlink(&mut self, rel: &Path, target: &Path) -> Result<(), InstallError> {
        let outside = || {
            InstallError::Unsafe(format!(
                "the symlink `{}` points to `{}`, outside the archive's folder",
                rel.display(),
                target.display()
            ))
        };
        if target.as_os_str().is_empty() {
            return Err(outside());
        }
        let mut resolved: Vec<Component> = rel
            .parent()
            .map(|p| p.components().collect())
            .unwrap_or_default();
        for component in target.components() {
            match component {
                Component::Normal(_) => resolved.push(component),
                Component::CurDir => {}
                Component::ParentDir => {
                    resolved.pop().ok_or_else(outside)?;
                }
                Component::RootDir | Component::Prefix(_) => return Err(outside()),
            }
        }
        let path = self.place(rel)?;
        std::os::unix::fs::symlink(target, &path)
            .map_err(|e| InstallError::io(format!("linking {}", path.display()), e))
    }

    /// A hard link entry, made only to a plain file the archive already put inside.
    fn hard_link(&mut self, rel: &Path, target: &Path) -> Result<(), InstallError> {
        let refused = || {
            InstallError::Unsafe(format!(
                "the hard link `{}` points to `{}`, which is not a file inside the archive's folder",
                rel.display(),
                target.display()
            ))
        };
        let target_rel = self.relative(target).map_err(|_| refused())?;
        let mut at = self.dest.clone();
        for component in target_rel.components() {
            at.push(component);
            let meta = fs::symlink_metadata(&at).map_err(|_| refused())?;
            if meta.file_type().is_symlink() {
                return Err(refused());
            }
        }
        if target_rel.as_os_str().is_empty()
            || !fs::symlink_metadata(&at).is_ok_and(|m| m.is_file())
        {
            return Err(refused());
        }
        let path = self.place(rel)?;
        fs::hard_link(&at, &path)
            .map_err(|e| InstallError::io(format!("linking {}", path.display()), e))
    }
}
