//! The host's NVIDIA GPUs, from NVML (`libnvidia-ml.so.1`, loaded at run time: a host without
//! the NVIDIA driver simply has none to report).
use nvml_wrapper::Nvml;

/// One GPU as NVML describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuDevice {
    pub index: u32,
    pub name: String,
    pub uuid: String,
    pub memory_total_bytes: u64,
}

impl std::fmt::Display for GpuDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "GPU {}: {} ({}), {:.1} GiB",
            self.index,
            self.name,
            self.uuid,
            self.memory_total_bytes as f64 / (1u64 << 30) as f64
        )
    }
}

/// The NVIDIA driver's version and its GPUs, or why NVML could not say.
pub fn devices() -> Result<(String, Vec<GpuDevice>), String> {
    let nvml = Nvml::init().map_err(|e| format!("NVML not available ({e})"))?;
    let driver = nvml
        .sys_driver_version()
        .unwrap_or_else(|_| "unknown".into());
    let count = nvml.device_count().map_err(|e| format!("NVML: {e}"))?;
    let devices = (0..count)
        .filter_map(|index| {
            let device = nvml.device_by_index(index).ok()?;
            Some(GpuDevice {
                index,
                name: device.name().unwrap_or_else(|_| "unknown".into()),
                uuid: device.uuid().unwrap_or_else(|_| "unknown".into()),
                memory_total_bytes: device.memory_info().map(|m| m.total).unwrap_or(0),
            })
        })
        .collect();
    Ok((driver, devices))
}

/// One line for logs and `infertrace doctor`.
pub fn describe() -> Result<String, String> {
    let (driver, devices) = devices()?;
    if devices.is_empty() {
        return Ok(format!("NVIDIA driver {driver}, no GPU"));
    }
    let list: Vec<String> = devices.iter().map(ToString::to_string).collect();
    Ok(format!("NVIDIA driver {driver}: {}", list.join("; ")))
}
