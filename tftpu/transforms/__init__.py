"""tftpu.transforms"""
