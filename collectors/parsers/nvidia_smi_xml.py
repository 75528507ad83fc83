"""Parser for `nvidia-smi -q -x`: the XML report of every GPU, one AcceleratorDevice each.

nvidia-smi writes

    <?xml version="1.0" ?>
    <!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">
    <nvidia_smi_log>
        <driver_version>535.54.03</driver_version> ...
        <gpu id="00000000:01:00.0">
            <product_name>NVIDIA A100-SXM4-80GB</product_name> ...

with values as text and their unit ("27 C", "67.03 W", "50 MiB", "65 %", "N/A"). Element
names moved between driver branches; in the public reports read (telegraf's testdata),
power is `power_readings/power_draw` up to the 525 drivers, `gpu_power_readings/power_draw`
with 535 and `gpu_power_readings/instant_power_draw` with 595, and the volatile ECC counts
are `single_bit/total` and `double_bit/total` in some reports, one element per memory
(`sram_correctable`, `dram_uncorrectable`, ...) in others.

The text comes from a tool on a node that may be compromised, so it is parsed with expat
directly: a DOCTYPE is accepted only as nvidia-smi writes it, a bare external reference that
is never fetched; an internal subset (where entities would be declared: the "billion laughs"
expansion), an entity declaration, an external or undeclared entity reference are
ParseErrors, and so are an input over MAX_OUTPUT_CHARS and more than MAX_ELEMENTS elements.
"""

from __future__ import annotations

from xml.etree.ElementTree import Element, TreeBuilder
from xml.parsers import expat

from . import ParseError
from .accelerator import AcceleratorDevice, check_size, count, measure, mebibytes

WHAT = "nvidia-smi -q -x"
ROOT = "nvidia_smi_log"
# A GPU's report has about 400 elements (its supported-clock table most of them); 64 GPUs of
# them fit many times over.
MAX_ELEMENTS = 200_000
_POWER_PATHS = ("gpu_power_readings/power_draw", "gpu_power_readings/instant_power_draw",
                "gpu_power_readings/average_power_draw", "power_readings/power_draw")


def safe_xml_tree(text: str, what: str = WHAT) -> Element:
    """The element tree of `text`, refusing what a tool's XML report never holds (see the
    module docstring), or ParseError."""
    check_size(text, what)
    builder = TreeBuilder()
    elements = 0

    def start(tag: str, attributes: dict[str, str]) -> None:
        nonlocal elements
        elements += 1
        if elements > MAX_ELEMENTS:
            raise ParseError(f"{what}: more than {MAX_ELEMENTS} elements")
        builder.start(tag, attributes)

    def doctype(name: str, system_id: str | None, public_id: str | None,
                has_internal_subset: bool) -> None:
        if has_internal_subset:
            raise ParseError(f"{what}: a DOCTYPE with an internal subset (entity definitions)")

    def refuse_entity(*_args: object) -> None:
        raise ParseError(f"{what}: an entity declaration")

    def refuse_external(*_args: object) -> int:
        raise ParseError(f"{what}: an external entity reference")

    def refuse_skipped(name: str, _is_parameter: bool) -> None:
        # expat skips, rather than rejects, an undeclared &name; once a DOCTYPE is present
        raise ParseError(f"{what}: a reference to the undeclared entity {name[:40]!r}")

    # The encoding is fixed: a declaration naming another one cannot change how text is read.
    parser = expat.ParserCreate("utf-8")
    parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
    parser.StartElementHandler = start
    parser.EndElementHandler = builder.end
    parser.CharacterDataHandler = builder.data
    parser.StartDoctypeDeclHandler = doctype
    parser.EntityDeclHandler = refuse_entity
    parser.UnparsedEntityDeclHandler = refuse_entity
    parser.ExternalEntityRefHandler = refuse_external
    parser.SkippedEntityHandler = refuse_skipped
    try:
        parser.Parse(text.encode("utf-8", "surrogatepass"), True)
        return builder.close()
    except expat.ExpatError as err:
        raise ParseError(f"{what}: not well-formed XML ({err})") from None
    except AssertionError:  # TreeBuilder.close on a document expat let end early
        raise ParseError(f"{what}: no complete document") from None


def parse_nvidia_smi_xml(text: str) -> list[AcceleratorDevice]:
    """The GPUs of an `nvidia-smi -q -x` report, in the order nvidia-smi lists them (its GPU
    index order). A <gpu> with neither a PCI address nor a UUID is skipped.

    >>> gpu = ('<nvidia_smi_log><driver_version>535.54.03</driver_version><gpu id="0:01:00.0">'
    ...        '<fb_memory_usage><used>50 MiB</used></fb_memory_usage>'
    ...        '<temperature><gpu_temp>27 C</gpu_temp></temperature></gpu></nvidia_smi_log>')
    >>> device = parse_nvidia_smi_xml(gpu)[0]
    >>> device.bus_id, device.memory_used_bytes, device.temperature_c, device.driver_version
    ('0:01:00.0', 52428800, 27.0, '535.54.03')
    """
    root = safe_xml_tree(text)
    if root.tag != ROOT:
        raise ParseError(f"{WHAT}: root element <{root.tag[:40]}>, not <{ROOT}>")
    driver = _text(root, "driver_version")
    devices = []
    for position, gpu in enumerate(root.findall("gpu")):
        bus_id = gpu.get("id") or _text(gpu, "pci/pci_bus_id")
        uuid = _text(gpu, "uuid")
        if not bus_id and not uuid:
            continue
        corrected, uncorrected = _volatile_ecc(gpu)
        devices.append(AcceleratorDevice(
            vendor="nvidia", index=position, model=_text(gpu, "product_name"), bus_id=bus_id,
            uuid=uuid, utilization_percent=measure(_text(gpu, "utilization/gpu_util")),
            memory_used_bytes=mebibytes(_text(gpu, "fb_memory_usage/used")),
            memory_free_bytes=mebibytes(_text(gpu, "fb_memory_usage/free")),
            memory_total_bytes=mebibytes(_text(gpu, "fb_memory_usage/total")),
            temperature_c=measure(_text(gpu, "temperature/gpu_temp")),
            power_w=next((watts for watts in (measure(_text(gpu, path)) for path in _POWER_PATHS)
                          if watts is not None), None),
            driver_version=driver, firmware_version=_text(gpu, "vbios_version"),
            ecc_corrected=corrected, ecc_uncorrected=uncorrected))
    return devices


def _text(element: Element, path: str) -> str | None:
    node = element.find(path)
    if node is None or node.text is None:
        return None
    return node.text.strip() or None


def _volatile_ecc(gpu: Element) -> tuple[int | None, int | None]:
    """(corrected, uncorrected) volatile ECC errors, None where ECC is off or not reported."""
    volatile = gpu.find("ecc_errors/volatile")
    if volatile is None:
        return None, None
    if volatile.find("single_bit") is not None:  # before dtd v12
        return (count(_text(volatile, "single_bit/total")),
                count(_text(volatile, "double_bit/total")))
    corrected = uncorrected = None
    for node in volatile:
        value = count(node.text)
        if value is None:
            continue
        if "uncorrectable" in node.tag:
            uncorrected = (uncorrected or 0) + value
        elif "correctable" in node.tag:
            corrected = (corrected or 0) + value
    return corrected, uncorrected
