//! Hyper-V sockets on the host (Windows only): the listener the guest agent
//! connects to, bound to one VM's runtime id and the agent's service id, and
//! the stream the `hull-protocol` frames travel on.

use std::io;
use std::sync::OnceLock;
use std::time::Duration;

use windows_sys::core::GUID;
use windows_sys::Win32::Networking::WinSock::{
    accept, bind, closesocket, listen, recv, select, send, setsockopt, socket, WSAGetLastError,
    WSAStartup, AF_HYPERV, FD_SET, INVALID_SOCKET, SOCKADDR, SOCKET, SOCK_STREAM, SOL_SOCKET,
    SO_RCVTIMEO, TIMEVAL, WSADATA,
};
use windows_sys::Win32::System::Hypervisor::{HV_PROTOCOL_RAW, SOCKADDR_HV};

use super::Guid;

fn startup() -> io::Result<()> {
    static RC: OnceLock<i32> = OnceLock::new();
    let rc = *RC.get_or_init(|| {
        // SAFETY: plain data filled by WSAStartup.
        let mut data: WSADATA = unsafe { std::mem::zeroed() };
        // SAFETY: version 2.2 and a valid out-pointer; called once per process.
        unsafe { WSAStartup(0x0202, &mut data) }
    });
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(rc))
    }
}

fn last() -> io::Error {
    // SAFETY: no preconditions.
    io::Error::from_raw_os_error(unsafe { WSAGetLastError() })
}

fn addr(vm: Guid, service: Guid) -> SOCKADDR_HV {
    SOCKADDR_HV {
        Family: AF_HYPERV,
        Reserved: 0,
        VmId: GUID::from_u128(vm.0),
        ServiceId: GUID::from_u128(service.0),
    }
}

/// A socket closed on drop.
#[derive(Debug)]
struct Sock(SOCKET);

impl Drop for Sock {
    fn drop(&mut self) {
        // SAFETY: the socket is owned and closed once.
        unsafe { closesocket(self.0) };
    }
}

fn new_socket() -> io::Result<Sock> {
    startup()?;
    // SAFETY: no preconditions beyond WSAStartup (done above).
    let s = unsafe { socket(i32::from(AF_HYPERV), SOCK_STREAM, HV_PROTOCOL_RAW as i32) };
    if s == INVALID_SOCKET {
        return Err(last());
    }
    Ok(Sock(s))
}

/// Listens for one VM's connections to one service.
#[derive(Debug)]
pub struct HvListener(Sock);

impl HvListener {
    /// Binds to (`vm` runtime id, `service`): only that VM can connect.
    pub fn bind(vm: Guid, service: Guid) -> io::Result<HvListener> {
        let s = new_socket()?;
        let a = addr(vm, service);
        // SAFETY: `a` is a valid SOCKADDR_HV of the size passed.
        let r = unsafe {
            bind(
                s.0,
                &a as *const _ as *const SOCKADDR,
                std::mem::size_of::<SOCKADDR_HV>() as i32,
            )
        };
        if r != 0 {
            return Err(last());
        }
        // SAFETY: a bound socket.
        if unsafe { listen(s.0, 1) } != 0 {
            return Err(last());
        }
        Ok(HvListener(s))
    }

    /// Waits at most `timeout` for a connection, then accepts it.
    pub fn accept_timeout(&self, vm: Guid, timeout: Duration) -> io::Result<HvStream> {
        let mut set = FD_SET {
            fd_count: 1,
            fd_array: [0; 64],
        };
        set.fd_array[0] = self.0 .0;
        let tv = TIMEVAL {
            tv_sec: i32::try_from(timeout.as_secs()).unwrap_or(i32::MAX),
            tv_usec: timeout.subsec_micros() as i32,
        };
        // SAFETY: `set` holds one valid socket; `tv` is a valid timeout; the
        // other sets are null (allowed).
        let r = unsafe { select(0, &mut set, std::ptr::null_mut(), std::ptr::null_mut(), &tv) };
        match r {
            0 => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the guest agent of VM {vm} did not connect within {timeout:?}"),
            )),
            n if n < 0 => Err(last()),
            _ => self.accept(vm),
        }
    }

    /// Accepts the agent's connection; the peer is checked to be `vm`.
    pub fn accept(&self, vm: Guid) -> io::Result<HvStream> {
        // SAFETY: plain data, filled by accept.
        let mut peer: SOCKADDR_HV = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<SOCKADDR_HV>() as i32;
        // SAFETY: a listening socket; `peer`/`len` describe a valid buffer.
        let s = unsafe { accept(self.0 .0, &mut peer as *mut _ as *mut SOCKADDR, &mut len) };
        if s == INVALID_SOCKET {
            return Err(last());
        }
        let stream = HvStream(Sock(s));
        let got = peer.VmId;
        let got = (u128::from(got.data1) << 96)
            | (u128::from(got.data2) << 80)
            | (u128::from(got.data3) << 64)
            | u128::from(u64::from_be_bytes(got.data4));
        if got != vm.0 {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("Hyper-V socket peer {} is not VM {vm}", Guid(got)),
            ));
        }
        Ok(stream)
    }
}

/// A connected Hyper-V socket.
#[derive(Debug)]
pub struct HvStream(Sock);

impl HvStream {
    /// Connects to a service of a VM (host to guest).
    pub fn connect(vm: Guid, service: Guid) -> io::Result<HvStream> {
        let s = new_socket()?;
        let a = addr(vm, service);
        // SAFETY: `a` is a valid SOCKADDR_HV of the size passed.
        let r = unsafe {
            windows_sys::Win32::Networking::WinSock::connect(
                s.0,
                &a as *const _ as *const SOCKADDR,
                std::mem::size_of::<SOCKADDR_HV>() as i32,
            )
        };
        if r != 0 {
            return Err(last());
        }
        Ok(HvStream(s))
    }

    /// A receive timeout (`None`: block).
    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        let ms: u32 = t.map_or(0, |d| {
            u32::try_from(d.as_millis()).unwrap_or(u32::MAX).max(1)
        });
        // SAFETY: a valid socket; the option value is a DWORD of the size passed.
        let r = unsafe {
            setsockopt(
                self.0 .0,
                SOL_SOCKET,
                SO_RCVTIMEO,
                &ms as *const u32 as *const u8,
                4,
            )
        };
        if r != 0 {
            return Err(last());
        }
        Ok(())
    }
}

impl io::Read for HvStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = buf.len().min(i32::MAX as usize) as i32;
        // SAFETY: `buf` is valid for `n` bytes of writes.
        let r = unsafe { recv(self.0 .0, buf.as_mut_ptr(), n, 0) };
        if r < 0 {
            return Err(last());
        }
        Ok(r as usize)
    }
}

impl io::Write for HvStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = buf.len().min(i32::MAX as usize) as i32;
        // SAFETY: `buf` is valid for `n` bytes of reads.
        let r = unsafe { send(self.0 .0, buf.as_ptr(), n, 0) };
        if r < 0 {
            return Err(last());
        }
        Ok(r as usize)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
