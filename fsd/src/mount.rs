//! Mounting and serving, under fsd's old path: the generic machinery (the mount
//! options, mount(2), serving until unmounted or signalled) lives in the
//! `rmemfs-fuse` crate (`rmemfs_fuse::mount`), which nullfs uses without fsd.
//! fsd's own mount options (`cache=`, the SOURCE) are the mount helper's
//! (`mount_helper/`).

pub use rmemfs_fuse::mount::{
    fsname_arg, options, options_arg, Atime, MountOptions, MountSpec, Mounted, Serving,
    UnknownMountOption,
};
