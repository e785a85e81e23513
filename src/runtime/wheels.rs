//! The official ONNX Runtime wheels batchinfer fetches from PyPI: where each is and what it and
//! its members must hash to.

/// One wheel of PyPI a library is taken from (`onnxruntime==1.31.1`, `pypdfium2==5.15.2`):
/// where it is and what it must hash to.
pub(crate) struct Wheel {
    /// What it holds, as its fetch is told.
    pub(crate) package: &'static str,
    /// The folder of the wheel its members are in.
    pub(crate) folder: &'static str,
    /// How to give batchinfer the library where it cannot be fetched.
    pub(crate) hint: &'static str,
    pub(crate) os: &'static str,
    pub(crate) arch: &'static str,
    pub(crate) url: &'static str,
    pub(crate) sha256: &'static str,
    pub(crate) library: &'static str,
    /// The sha256 of each member batchinfer unpacks from it (the library, the CUDA providers).
    pub(crate) members: &'static [(&'static str, &'static str)],
}

pub(crate) const PYPI: &str = "https://files.pythonhosted.org/packages";

const ORT_HINT: &str = "Set ORT_DYLIB_PATH to an ONNX Runtime 1.31.1 library, for example the \
                        one that `pip install onnxruntime==1.31.1` puts in \
                        site-packages/onnxruntime/capi/";

pub(crate) const WHEELS: &[Wheel] = &[
    Wheel {
        package: "ONNX Runtime 1.31.1",
        folder: "onnxruntime/capi",
        hint: ORT_HINT,
        os: "linux",
        arch: "x86_64",
        url: "eb/27/c6a823bac55b2977bea2027c3ec9393a2c1002cb9a09eb40354563e02730/onnxruntime-1.31.1-cp312-cp312-manylinux_2_28_x86_64.whl",
        sha256: "1f3dea47f2f0e5117c2404cea7d21fd253ae7836a3bf167a501cdfbb2600d536",
        library: "libonnxruntime.so.1.31.1",
        members: &[(
            "libonnxruntime.so.1.31.1",
            "fc44112fbe06d7d689c57e11d3862031f64711007e4ee020f8eed5185fd2c1d3",
        )],
    },
    Wheel {
        package: "ONNX Runtime 1.31.1",
        folder: "onnxruntime/capi",
        hint: ORT_HINT,
        os: "linux",
        arch: "aarch64",
        url: "ba/e4/1ed1a7a5f4702d899091fa2b976d377995250c307326ec8dc9ae6378aa13/onnxruntime-1.31.1-cp312-cp312-manylinux_2_28_aarch64.whl",
        sha256: "0b9a492176886992e0e875f06bc0367e333f5fff11711a2d642e18b02f3009cc",
        library: "libonnxruntime.so.1.31.1",
        members: &[(
            "libonnxruntime.so.1.31.1",
            "8aa3b76b28c778a2b1dd660d34161adb1d508c9ccd04ff9dc80e26eca5df8467",
        )],
    },
    Wheel {
        package: "ONNX Runtime 1.31.1",
        folder: "onnxruntime/capi",
        hint: ORT_HINT,
        os: "macos",
        arch: "aarch64",
        url: "0e/f7/cecc0efeeea83bff2f7789ae1b80f27fa0f0210d6d9d66d1f0031a6b5e47/onnxruntime-1.31.1-cp312-cp312-macosx_14_0_arm64.whl",
        sha256: "96dd2564b10ea7153ad9c207e7cd8e5917cb3ba521e0e0a62ac03486fdc8d56c",
        library: "libonnxruntime.1.31.1.dylib",
        members: &[(
            "libonnxruntime.1.31.1.dylib",
            "d586cbe89effc085a09d3341b3cfbd5c322517f9d397aeb20814af21433f2b36",
        )],
    },
];

/// The CUDA 13 build, `onnxruntime-gpu==1.31.1`, and the provider libraries taken from it beside
/// `libonnxruntime`: ONNX Runtime looks for its providers in its own folder.
pub(crate) const CUDA_WHEELS: &[Wheel] = &[Wheel {
    package: "ONNX Runtime 1.31.1 (CUDA)",
    folder: "onnxruntime/capi",
    hint: "Set ORT_DYLIB_PATH to the libonnxruntime of a CUDA build of ONNX Runtime 1.31.1, as \
           `pip install onnxruntime-gpu==1.31.1` puts in site-packages/onnxruntime/capi/",
    os: "linux",
    arch: "x86_64",
    url: "22/97/9531b4d9e566cf2a0f04b4b5c26a3bc0ef2e2e0b6bc943a02c0eead98cf7/onnxruntime_gpu-1.31.1-cp312-cp312-manylinux_2_28_x86_64.whl",
    sha256: "05d548956197b9d01f59b625de740e0d6be3593f874e241a12dc0362650ecdf7",
    library: "libonnxruntime.so.1.31.1",
    members: &[
        (
            "libonnxruntime.so.1.31.1",
            "5104254339ecadae808da771bd0b63b240f0dbd466514234905e54372435c303",
        ),
        (
            "libonnxruntime_providers_shared.so",
            "086ec1d5388f64153d9c63470d126693db9a182c8ce236d3a1119068471b8a0d",
        ),
        (
            "libonnxruntime_providers_cuda.so",
            "8387867e857499e045caff5d13ac6a5de29571c801562fa2dde0e45f1f31de52",
        ),
    ],
}];
